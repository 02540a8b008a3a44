"""Worker loss: a real worker process is SIGKILLed mid-step, another one (with beat running the
sweeper) takes over. Exactly one email; a command that changed the workspace is not repeated."""

import json
import os
import signal
import subprocess
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User

from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_decide
from sessions_app.engine.commands import session_start
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from tests import factories
from tests.helpers import WorkerFactory, assert_gap_free, finished, sandboxed
from tests.waiting import wait_for
from tools_app.models import Outbox, ToolDefinition


def _setup(scripted_model_url: str) -> tuple[AgentProfile, User, User]:
    from tools_app.services import tool_definitions_seed

    tool_definitions_seed()
    agent = factories.agent_profile(base_url=scripted_model_url)
    agent.tools.set(ToolDefinition.objects.all())
    return (agent, factories.user("op", groups=["operators"]), factories.user("rev", groups=["reviewers"]))


def _approve_first(turn: Turn, reviewer: User, kind: str = "tool", decision: str = "approve") -> ApprovalRequest:
    approval = wait_for(lambda: ApprovalRequest.objects.filter(turn=turn, kind=kind, status="pending").first(),
                        60, f"a pending {kind} request")
    approval_decide(request_id=approval.request_id, actor=reviewer, decision=decision,
                    seen_hash=approval.arguments_sha256)
    return approval


def _approved_command(worker_process: WorkerFactory, scripted_model_url: str, command: str
                      ) -> tuple[User, subprocess.Popen[bytes], AgentSession, Turn, ApprovalRequest]:
    """A worker, and a turn whose run_command (4 s timeout) a reviewer approved: it starts now."""
    agent, operator, reviewer = _setup(scripted_model_url)
    ToolDefinition.objects.filter(name="run_command").update(timeout_seconds=4)
    worker_process(kind="gateway")
    first = worker_process()
    session, turn = session_start(agent=agent, owner=operator,
                                  input=f"tool run_command {json.dumps({'command': command})}\nsay {{results}}")
    assert turn is not None
    return reviewer, first, session, turn, _approve_first(turn, reviewer)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_recovery_worker_killed_during_send_email_sends_exactly_one(
        worker_process: WorkerFactory, scripted_model_url: str) -> None:
    agent, operator, reviewer = _setup(scripted_model_url)
    ToolDefinition.objects.filter(name="send_email").update(timeout_seconds=2)
    worker_process(kind="gateway")
    first = worker_process(failpoint="send_email:60")
    email = {"to": "cfo@example.com", "subject": "Refund", "body": "Your refund is on its way."}
    _session, turn = session_start(agent=agent, owner=operator,
                                   input=f"tool send_email {json.dumps(email)}\nsay sent: {{results}}")
    assert turn is not None
    approval = _approve_first(turn, reviewer)
    # The email went out; the worker is held before recording the step's result. Kill it there.
    wait_for(lambda: Outbox.objects.filter(to="cfo@example.com", status="sent").exists(), 60, "the email")
    assert Step.objects.get(pk=approval.step_id).status == "running"
    _kill(first)
    worker_process(beat=True)
    turn = finished(turn)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert Outbox.objects.filter(to="cfo@example.com").count() == 1
    step = Step.objects.get(pk=approval.step_id)
    assert step.status == "completed" and step.attempts == 2
    assert Event.objects.filter(step_id=step.id, type="step.recovered", payload__outcome="retry").exists()
    assert_gap_free(turn.session_id)


def test_recovery_worker_killed_during_command_that_changed_workspace_goes_in_doubt(
        worker_process: WorkerFactory, scripted_model_url: str) -> None:
    reviewer, first, session, turn, approval = _approved_command(
        worker_process, scripted_model_url, "echo ran >> count.txt; sleep 3")
    workspace = Path(settings.AGENTOPS_WORKSPACE_ROOT) / str(session.id)
    wait_for(lambda: (workspace / "count.txt").exists(), 60, "the command's first effect")
    _kill(first)
    worker_process(beat=True)
    # The workspace changed since the command started: never replayed blindly, a reviewer decides.
    recovery_request = _approve_first(turn, reviewer, kind="recovery", decision="mark_done")
    assert Step.objects.get(pk=approval.step_id).status == "completed"
    turn = finished(turn)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert (workspace / "count.txt").read_text() == "ran\n"  # the command ran once
    assert recovery_request.step_id == approval.step_id
    assert Event.objects.filter(step_id=approval.step_id, type="tool.in_doubt").exists()
    # The reviewer is told which files changed (it said only "the workspace changed": a fault audit).
    assert recovery_request.risk_note.endswith("changed since it started: created count.txt."), \
        recovery_request.risk_note
    assert_gap_free(turn.session_id)


def test_recovery_worker_killed_before_command_changed_anything_retries_it(
        worker_process: WorkerFactory, scripted_model_url: str) -> None:
    marker = f"2.{os.getpid() % 1000}"  # a sleep of ~2 s of this test's own, findable by its argv
    _reviewer, first, session, turn, approval = _approved_command(
        worker_process, scripted_model_url, f"sleep {marker}; echo ran >> count.txt")
    # The command runs and has not changed anything yet (its effect comes after the sleep).
    wait_for(lambda: sandboxed(f"sleep {marker}"), 60, "the command's process")
    _kill(first)
    worker_process(beat=True)
    turn = finished(turn)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    workspace = Path(settings.AGENTOPS_WORKSPACE_ROOT) / str(session.id)
    assert (workspace / "count.txt").read_text() == "ran\n"
    assert not ApprovalRequest.objects.filter(turn=turn, kind="recovery").exists()
    assert Step.objects.get(pk=approval.step_id).attempts == 2


def test_recovery_gateway_killed_during_inline_read_only_calls_reruns_the_model_step(
        worker_process: WorkerFactory, scripted_model_url: str, tmp_path: Path) -> None:
    """Read-only calls run inline in the gateway before anything of their reply is recorded: a
    gateway lost there leaves the model step's lease to expire, and the model call (and so the
    calls) run again."""
    agent, operator, _reviewer = _setup(scripted_model_url)
    marker = tmp_path / "held"
    first = worker_process(kind="gateway", failpoint="list_files:60", marker=marker)
    call = 'tool list_files {"path": "."}'
    _session, turn = session_start(agent=agent, owner=operator, input=f"{call}\n{call}\nsay {{results}}")
    assert turn is not None
    worker_process()
    wait_for(marker.exists, 60, "the gateway held after list_files ran")
    model_step = Step.objects.get(turn=turn, index=0)
    assert model_step.status == "running"
    assert not Step.objects.filter(turn=turn, kind="tool").exists()  # nothing of the reply is recorded yet
    _kill(first)
    worker_process(kind="gateway")
    worker_process(beat=True)
    turn = finished(turn, timeout=90)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    steps = list(Step.objects.filter(turn=turn).order_by("index").values_list("kind", "status", "attempts"))
    assert steps == [("model", "completed", 2), ("tool", "completed", 1), ("model", "completed", 1),
                     ("tool", "completed", 1), ("model", "completed", 1)]
    assert Event.objects.filter(step_id=model_step.id, type="step.recovered", payload__outcome="retry").exists()
    assert turn.output_text.count("list_files:") == 2
    assert_gap_free(turn.session_id)
