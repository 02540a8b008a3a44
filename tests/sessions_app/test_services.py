"""The sessions services and the engine's commands, called directly: claims, idempotency, cancel,
client tool outputs. No worker: these are the guards every task relies on."""

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agentops.domain import Conflict, InvalidTransition
from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_request_create
from sessions_app.engine.commands import session_cancel, tool_output_submit
from sessions_app.engine.record import StepChange
from sessions_app.models import AgentSession, Event, Step, Turn
from sessions_app.services import step_claim, step_create_claimed, turn_create, turn_transition
from tests import factories

pytestmark = pytest.mark.django_db


def _step(status: str, **fields: Any) -> Step:
    step = factories.step(factories.turn(), **fields)
    Step.objects.filter(pk=step.pk).update(status=status)
    step.refresh_from_db()
    return step


# --- step_claim: exactly one caller wins ---------------------------------------------------------


def test_step_claim_twice_second_gets_nothing() -> None:
    step = _step("approved")
    first = step_claim(step_id=step.id, from_status="approved", lease_seconds=30, event_type="tool.started")
    assert first is not None and first.status == "running" and first.attempts == 1
    assert step_claim(step_id=step.id, from_status="approved", lease_seconds=30, event_type="tool.started") is None
    row = Step.objects.get(pk=step.pk)
    assert (row.status, row.attempts) == ("running", 1)
    assert Event.objects.filter(step_id=step.id, type="tool.started").count() == 1


def test_step_claim_with_a_stale_known_row_gets_nothing() -> None:
    """The caller read the step planned; someone claimed it since: the known row is not trusted."""
    step = _step("planned", kind="model", tool_name="")
    stale = Step.objects.get(pk=step.pk)
    assert step_claim(step_id=step.id, from_status="planned", lease_seconds=30, event_type="model.started")
    assert step_claim(step_id=step.id, from_status="planned", lease_seconds=30, event_type="model.started",
                      known=stale) is None
    assert Step.objects.get(pk=step.pk).attempts == 1


def test_step_claim_from_a_status_that_cannot_run_is_refused() -> None:
    step = _step("completed")
    with pytest.raises(InvalidTransition):
        step_claim(step_id=step.id, from_status="completed", lease_seconds=30, event_type="tool.started")
    assert Step.objects.get(pk=step.pk).status == "completed"


def test_step_create_claimed_is_running_with_a_lease() -> None:
    turn = factories.turn()
    step = step_create_claimed(session_id=turn.session_id, turn_id=turn.id, index=0, kind="model", lease_seconds=60,
                               event_type="model.started")
    row = Step.objects.get(pk=step.pk)
    assert row.status == "running" and row.attempts == 1
    assert row.lease_expires_at is not None and row.lease_expires_at > timezone.now()
    assert Event.objects.get(step_id=step.id).type == "model.started"


def test_step_change_is_checked_against_the_state_machine() -> None:
    with pytest.raises(InvalidTransition):
        StepChange(uuid.uuid4(), "completed", "running", {})
    assert StepChange(uuid.uuid4(), "running", "completed", {}).to == "completed"


# --- turn_transition carries the session ----------------------------------------------------------


@pytest.mark.parametrize(("to", "session_status"), [("running", "in_progress"), ("awaiting_approval",
                                                                                 "awaiting_approval"),
                                                    ("requires_action", "requires_action")])
def test_turn_transition_moves_the_session_with_it(to: str, session_status: str) -> None:
    turn = factories.turn()
    if to != "running":
        turn_transition(turn_id=turn.id, to="running")
    turn_transition(turn_id=turn.id, to=to)
    assert AgentSession.objects.get(pk=turn.session_id).status == session_status


@pytest.mark.parametrize(("to", "session_status"), [("completed", "idle"), ("cancelled", "idle"),
                                                    ("failed", "failed")])
def test_turn_transition_finished_turn_frees_the_session(to: str, session_status: str) -> None:
    turn = factories.turn()
    turn_transition(turn_id=turn.id, to="running")
    turn_transition(turn_id=turn.id, to=to)
    session = AgentSession.objects.get(pk=turn.session_id)
    assert session.status == session_status and session.wall_seconds > 0


# --- turn_create: one active turn, idempotent by key -----------------------------------------------


def test_turn_create_same_idempotency_key_returns_the_first_turn_even_after_it_finished() -> None:
    session = factories.session()
    first = turn_create(session_id=session.id, input="once", idempotency_key="key-1")
    turn_transition(turn_id=first.id, to="running")
    turn_transition(turn_id=first.id, to="completed")
    again = turn_create(session_id=session.id, input="once", idempotency_key="key-1")
    assert again.pk == first.pk
    assert Turn.objects.filter(session=session).count() == 1
    assert Event.objects.filter(session=session, type="turn.queued").count() == 1


def test_turn_create_while_a_turn_is_active_is_409() -> None:
    session = factories.session()
    turn_create(session_id=session.id, input="first")
    with pytest.raises(Conflict) as refused:
        turn_create(session_id=session.id, input="second", idempotency_key="other")
    assert refused.value.code == "turn_active"
    assert Turn.objects.filter(session=session).count() == 1


# --- session_cancel: nothing is left waiting -------------------------------------------------------


def test_session_cancel_cancels_the_turns_open_approvals_and_steps() -> None:
    turn = factories.turn()
    turn_transition(turn_id=turn.id, to="running")
    waiting = factories.step(turn, tool_name="run_command", arguments={"command": "x"}, approval_mode="mutating")
    approval = approval_request_create(step_id=waiting.id)
    running = _step_in(turn, "running", index=5, lease_expires_at=timezone.now() + timedelta(seconds=60))
    session_cancel(session_id=turn.session_id)
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "cancelled"
    assert Step.objects.get(pk=waiting.pk).status == "cancelled"
    assert Step.objects.get(pk=running.pk).status == "cancelled"
    assert Turn.objects.get(pk=turn.pk).status == "cancelled"
    assert AgentSession.objects.get(pk=turn.session_id).status == "idle"
    types = list(Event.objects.filter(turn_id=turn.id).values_list("type", flat=True))
    assert "approval.cancelled" in types and types.count("tool.cancelled") == 2


def test_session_cancel_without_an_active_turn_changes_nothing() -> None:
    session = factories.session()
    last = AgentSession.objects.get(pk=session.pk).last_seq
    assert session_cancel(session_id=session.id).status == "idle"
    assert AgentSession.objects.get(pk=session.pk).last_seq == last


# --- tool_output_submit: only a client tool waits for one ------------------------------------------


def _step_in(turn: Turn, status: str, **fields: Any) -> Step:
    step = factories.step(turn, **fields)
    Step.objects.filter(pk=step.pk).update(status=status)
    step.refresh_from_db()
    return step


def test_tool_output_submit_refuses_a_running_sandboxed_command() -> None:
    turn = factories.turn()
    command = _step_in(turn, "running", tool_name="run_command", call_id="call_cmd",
                       lease_expires_at=timezone.now() + timedelta(seconds=60))
    with pytest.raises(Conflict) as refused:
        tool_output_submit(session_id=turn.session_id, call_id="call_cmd", output="forged")
    assert refused.value.code == "not_waiting"
    row = Step.objects.get(pk=command.pk)
    assert row.status == "running" and row.result is None


def test_tool_output_submit_completes_a_waiting_client_tool_once() -> None:
    turn = factories.turn()
    client_step = _step_in(turn, "running", tool_name="lookup", call_id="call_cli")
    tool_output_submit(session_id=turn.session_id, call_id="call_cli", output={"plan": "gold"})
    tool_output_submit(session_id=turn.session_id, call_id="call_cli", output={"plan": "gold"})  # a replay
    with pytest.raises(Conflict) as refused:
        tool_output_submit(session_id=turn.session_id, call_id="call_cli", output="different")
    assert refused.value.code == "already_submitted"
    assert Step.objects.get(pk=client_step.pk).status == "completed"
    assert Event.objects.filter(step_id=client_step.id, type="tool.output_submitted").count() == 1
