"""The sweeper's rules, step by step: what it retries, what it fails, what it puts in doubt.

Each test leaves a step running with an expired lease (what a dead worker leaves) and calls
``recovery.step_recover`` as the sweeper does. The SIGKILL tests in test_recovery.py prove the same
rules against real worker processes.
"""

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from approvals_app.models import ApprovalRequest
from sessions_app.engine import recovery
from sessions_app.engine.tool_steps import session_workspace
from sessions_app.models import AgentSession, Event, Step, Turn
from sessions_app.services import turn_transition
from tests import factories
from tools_app.models import ToolDefinition
from tools_app.sandbox import workspace_manifest
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db


def _dead_worker_left(tool_name: str, *, attempts: int = 1, manifest: dict | None = None,
                      kind: str = "tool") -> Step:
    """A step running under an expired lease, in a turn that runs."""
    tool_definitions_seed()
    session = factories.session()
    turn = factories.turn(session)
    turn_transition(turn_id=turn.id, to="running")
    step = factories.step(turn, kind=kind, tool_name=tool_name if kind == "tool" else "",
                          arguments={"command": "touch x"} if kind == "tool" else {})
    Step.objects.filter(pk=step.pk).update(status="running", attempts=attempts, manifest=manifest,
                                           lease_expires_at=timezone.now() - timedelta(seconds=1))
    return Step.objects.get(pk=step.pk)


def _workspace(step: Step) -> Path:
    return session_workspace(AgentSession.objects.select_related("agent").get(pk=step.session_id))


def _outcome(step: Step) -> str:
    return str(Event.objects.get(step_id=step.id, type="step.recovered").payload["outcome"])


def test_recover_command_with_an_unchanged_workspace_is_retried() -> None:
    step = _dead_worker_left("run_command")
    workspace = _workspace(step)
    Step.objects.filter(pk=step.pk).update(manifest=workspace_manifest(workspace))
    assert recovery.step_recover(step.id)
    assert Step.objects.get(pk=step.pk).status == "approved" and _outcome(step) == "retry"


def test_recover_command_that_changed_the_workspace_is_in_doubt() -> None:
    step = _dead_worker_left("run_command")
    workspace = _workspace(step)
    Step.objects.filter(pk=step.pk).update(manifest=workspace_manifest(workspace))
    (workspace / "x").write_text("the command's effect")
    assert recovery.step_recover(step.id)
    assert Step.objects.get(pk=step.pk).status == "in_doubt" and _outcome(step) == "in_doubt"
    assert ApprovalRequest.objects.get(step_id=step.id).kind == "recovery"


def test_recover_network_tool_is_in_doubt_even_with_an_unchanged_workspace() -> None:
    """http_request may have reached the network: its effect cannot be read off the workspace."""
    step = _dead_worker_left("http_request")
    Step.objects.filter(pk=step.pk).update(manifest=workspace_manifest(_workspace(step)))
    assert recovery.step_recover(step.id)
    assert Step.objects.get(pk=step.pk).status == "in_doubt"
    assert ApprovalRequest.objects.filter(step_id=step.id, kind="recovery", status="pending").exists()


def test_recover_command_given_host_network_is_in_doubt() -> None:
    ToolDefinition.objects.filter(name="run_command").update(network="host")
    step = _dead_worker_left("run_command")
    Step.objects.filter(pk=step.pk).update(manifest=workspace_manifest(_workspace(step)))
    assert recovery.step_recover(step.id)
    assert Step.objects.get(pk=step.pk).status == "in_doubt"


def test_recover_stops_retrying_at_max_attempts() -> None:
    ToolDefinition.objects.filter(name="write_file").update(max_attempts=3)
    retried = _dead_worker_left("write_file", attempts=2)
    assert recovery.step_recover(retried.id)
    assert Step.objects.get(pk=retried.pk).status == "approved"  # idempotent: retried
    capped = _dead_worker_left("write_file", attempts=3)
    assert recovery.step_recover(capped.id)
    assert Step.objects.get(pk=capped.pk).status == "in_doubt" and _outcome(capped) == "in_doubt"


def test_recover_model_step_retries_then_fails_the_turn_at_its_cap() -> None:
    retried = _dead_worker_left("", kind="model", attempts=recovery.MODEL_MAX_ATTEMPTS - 1)
    assert recovery.step_recover(retried.id)
    assert Step.objects.get(pk=retried.pk).status == "planned"
    capped = _dead_worker_left("", kind="model", attempts=recovery.MODEL_MAX_ATTEMPTS)
    assert recovery.step_recover(capped.id)
    assert Step.objects.get(pk=capped.pk).status == "failed"
    turn = Turn.objects.get(pk=capped.turn_id)
    assert turn.status == "failed" and turn.error_code == "model_unavailable" and turn.retryable


def test_recover_leaves_a_live_lease_alone() -> None:
    step = _dead_worker_left("run_command")
    Step.objects.filter(pk=step.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=30))
    assert not recovery.step_recover(step.id)
    assert Step.objects.get(pk=step.pk).status == "running"


def _turn_in(status: str, step_statuses: list[str], *, quiet_for: int = 60) -> Turn:
    """A turn left in ``status`` with tool steps in ``step_statuses``, untouched for ``quiet_for`` s."""
    turn = factories.turn(factories.session())
    Turn.objects.filter(pk=turn.pk).update(status=status)
    for status_ in step_statuses:
        factories.step(turn, tool_name="run_command", status=status_)
    then = timezone.now() - timedelta(seconds=quiet_for)
    Turn.objects.filter(pk=turn.pk).update(updated_at=then)
    AgentSession.objects.filter(pk=turn.session_id).update(last_event_at=then)
    return turn


def test_sweep_kicks_a_waiting_turn_whose_wait_is_over_and_leaves_real_waits_alone() -> None:
    """An approval decided (or a client tool answered) whose next tick was lost (Redis restarted
    between the commit and the hand-off, a worker killed holding it) left the turn waiting for
    nobody: the sweeper only poked queued and running turns (found by the chaos proof)."""
    approved = _turn_in(Turn.Status.AWAITING_APPROVAL, [Step.Status.COMPLETED, Step.Status.APPROVED])
    answered = _turn_in(Turn.Status.REQUIRES_ACTION, [Step.Status.COMPLETED])
    _turn_in(Turn.Status.AWAITING_APPROVAL, [Step.Status.AWAITING_APPROVAL])  # a reviewer's turn
    # An approved call runs even while another waits for its reviewer (the plan runs approved ones first).
    beside = _turn_in(Turn.Status.AWAITING_APPROVAL, [Step.Status.APPROVED, Step.Status.AWAITING_APPROVAL])
    _turn_in(Turn.Status.REQUIRES_ACTION, [Step.Status.RUNNING])  # the client has not answered yet
    _turn_in(Turn.Status.AWAITING_APPROVAL, [Step.Status.IN_DOUBT])  # a reviewer decides the recovery
    _turn_in(Turn.Status.AWAITING_APPROVAL, [Step.Status.APPROVED], quiet_for=5)  # its tick may still come
    kicked = recovery.turns_quiet(now=timezone.now(), limit=100)
    assert sorted(kicked) == sorted([approved.id, answered.id, beside.id])
    assert recovery.sweep()["turns_kicked"] == 3
