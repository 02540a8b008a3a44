"""No turn hangs silently: the sweeper re-drives turns whose wake-up was lost, without flooding
an overloaded engine; a client call that never gets an answer fails after its timeout; a repeated
decision wakes the engine again. The lost wake-ups are real: the deciding process's send fails
(``AGENTOPS_FAILPOINT_DROP_TICKS``) and the worker processes never hear of the decision."""

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agentops import dispatch
from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_decide
from sessions_app.engine import recovery
from sessions_app.engine.commands import session_start
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from sessions_app.services import turn_transition
from tests import factories
from tests.helpers import WorkerFactory, assert_gap_free, finished, pending_approvals, script, tool
from tools_app.models import ToolDefinition
from tools_app.selectors import tool_definitions_cache_clear


@pytest.fixture
def _empty_engine_queue() -> Iterator[None]:
    """No engine task, model-stream entry or kick marker of an earlier test in this run's Redis:
    the sweeper counts all of them as the engine's backlog (CI once saw a stream entry an earlier
    test left unread take one kick's room)."""
    client = dispatch.redis_client()

    def clear() -> None:
        client.delete(dispatch.ENGINE_QUEUE, dispatch.MODEL_STREAM)
        for key in client.scan_iter(f"{dispatch.KICK_MARKER}*"):
            client.delete(key)

    clear()
    yield
    clear()


def _start(agent: AgentProfile, owner: User, text: str) -> Turn:
    _session, turn = session_start(agent=agent, owner=owner, input=text)
    assert turn is not None
    return turn


def _decide_with_wakeup_lost(approval: ApprovalRequest, reviewer: User, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setenv("AGENTOPS_FAILPOINT_DROP_TICKS", "1")
        approval_decide(request_id=approval.request_id, actor=reviewer, decision="approve",
                        seen_hash=approval.arguments_sha256)
    # Nothing woke the engine: the step is approved, the turn still waits as before.
    time.sleep(3)
    assert Step.objects.get(pk=approval.step_id).status == "approved"
    assert Turn.objects.get(pk=approval.turn_id).status == "awaiting_approval"


def test_sweeper_redrives_a_turn_whose_decision_wakeup_was_lost(
        worker_process: WorkerFactory, engine_agent: AgentProfile, operator: User, reviewer: User,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTOPS_KICK_QUIET_SECONDS", "2")  # the workers' sweeper: quiet after 2 s
    worker_process(kind="gateway")
    worker_process()  # no sweeper yet
    turn = _start(engine_agent, operator, script(tool("run_command", command="echo hi"), "say ran: {results}"))
    (approval,) = pending_approvals(turn, timeout=60)
    _decide_with_wakeup_lost(approval, reviewer, monkeypatch)
    worker_process(beat=True)  # the sweeper finds the turn quiet with nothing in flight
    turn = finished(turn, timeout=60)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert "ran: " in turn.output_text and "hi" in turn.output_text
    assert_gap_free(turn.session_id)


def test_sweeper_repeated_decision_rewakes_the_engine(
        worker_process: WorkerFactory, engine_agent: AgentProfile, operator: User, reviewer: User,
        monkeypatch: pytest.MonkeyPatch) -> None:
    worker_process(kind="gateway")
    worker_process()  # no sweeper: only the second click can wake the turn
    turn = _start(engine_agent, operator, script(tool("run_command", command="echo again"), "say ran: {results}"))
    (approval,) = pending_approvals(turn, timeout=60)
    _decide_with_wakeup_lost(approval, reviewer, monkeypatch)
    client = Client()
    client.force_login(reviewer)
    again = client.post(f"/api/approvals/{approval.request_id}/decision",
                        json.dumps({"decision": "approve", "arguments_sha256": approval.arguments_sha256}),
                        content_type="application/json")
    assert again.status_code == 200, again.content
    turn = finished(turn, timeout=60)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert Event.objects.filter(turn=turn, type="approval.decided").count() == 1  # the replay recorded nothing


def test_sweeper_fails_a_client_call_that_never_gets_an_answer(
        worker_process: WorkerFactory, engine_agent: AgentProfile, operator: User) -> None:
    lookup = ToolDefinition.objects.create(name="lookup_customer", kind="client", approval_mode="safe_readonly",
                                           timeout_seconds=2,
                                           parameters_schema={"type": "object",
                                                              "properties": {"email": {"type": "string"}}})
    engine_agent.tools.add(lookup)
    tool_definitions_cache_clear()
    worker_process(kind="gateway")
    worker_process(beat=True)
    turn = _start(engine_agent, operator, script(tool("lookup_customer", email="a@example.com"), "say {results}"))
    turn = finished(turn, timeout=60)
    step = Step.objects.get(turn=turn, tool_name="lookup_customer")
    assert step.status == "failed" and step.error_code == "client_timeout"
    assert step.finished_at is not None and step.started_at is not None
    assert (step.finished_at - step.started_at).total_seconds() >= 2
    assert turn.status == "completed" and "did not submit an output" in turn.output_text
    failed = Event.objects.get(step_id=step.id, type="tool.failed")
    assert failed.payload["result"]["error_code"] == "client_timeout"


def _quiet_turn(status: str = "running", *, quiet_seconds: int = 120) -> Turn:
    session = factories.session()
    turn = factories.turn(session)
    turn_transition(turn_id=turn.id, to=status)
    long_ago = timezone.now() - timedelta(seconds=quiet_seconds)
    Turn.objects.filter(pk=turn.pk).update(updated_at=long_ago)
    AgentSession.objects.filter(pk=session.pk).update(last_event_at=long_ago)
    return turn


@pytest.mark.django_db
@pytest.mark.usefixtures("_empty_engine_queue")
def test_sweep_kicks_quiet_turns_bounded_and_deduplicated(settings: Any) -> None:
    settings.AGENTOPS_KICK_QUIET_SECONDS = 30
    settings.AGENTOPS_KICK_MAX_PER_SWEEP = 4
    settings.AGENTOPS_KICK_QUEUE_LIMIT = 1000
    quiet = [_quiet_turn() for _ in range(6)]
    lost_decision = _quiet_turn()  # awaiting_approval, but its step was approved: it can move
    step = factories.step(lost_decision, tool_name="run_command")
    Step.objects.filter(pk=step.pk).update(status="approved")
    Turn.objects.filter(pk=lost_decision.pk).update(status="awaiting_approval")
    recent = _quiet_turn(quiet_seconds=5)
    working = _quiet_turn()  # a command runs under a live lease: its worker wakes the turn
    factories.step(working, tool_name="run_command")
    Step.objects.filter(turn=working).update(status="running", lease_expires_at=timezone.now() + timedelta(hours=1))
    waiting = _quiet_turn()  # a reviewer has not decided yet
    factories.step(waiting, tool_name="run_command")
    Step.objects.filter(turn=waiting).update(status="awaiting_approval")
    client = dispatch.redis_client()

    first = recovery.sweep()
    assert first["turns_kicked"] == 4 and client.llen(dispatch.ENGINE_QUEUE) == 4
    second = recovery.sweep()  # the first four are still queued: three others go
    assert second["turns_kicked"] == 3 and client.llen(dispatch.ENGINE_QUEUE) == 7
    assert recovery.sweep()["turns_kicked"] == 0  # every candidate has a kick queued already
    queued = cast(list[bytes], client.lrange(dispatch.ENGINE_QUEUE, 0, -1))
    kicked = {json.loads(raw)["headers"]["argsrepr"] for raw in queued}
    expected = {repr([str(t.id)]) for t in [*quiet, lost_decision]}
    assert kicked == expected
    for other in (recent, working, waiting):
        assert repr([str(other.id)]) not in kicked
    # A kick that ran clears its marker: the turn may be kicked again if it stays quiet.
    dispatch.turn_kick_taken(quiet[0].id)
    assert recovery.sweep()["turns_kicked"] == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("_empty_engine_queue")
def test_sweep_kicks_nothing_while_the_engine_backlog_is_deep(settings: Any) -> None:
    settings.AGENTOPS_KICK_QUEUE_LIMIT = 5
    for _ in range(3):
        _quiet_turn()
    client = dispatch.redis_client()
    client.rpush(dispatch.ENGINE_QUEUE, *[b"busy"] * 5)  # a saturated box: five ticks wait already
    assert dispatch.engine_backlog() == 5
    assert recovery.sweep()["turns_kicked"] == 0
    client.ltrim(dispatch.ENGINE_QUEUE, 0, 2)  # three left: room for two kicks
    assert recovery.sweep()["turns_kicked"] == 2


def _ticks_queued() -> list[str]:
    """The turn ids of the engine ticks waiting in the queue."""
    queued = cast(list[bytes], dispatch.redis_client().lrange(dispatch.ENGINE_QUEUE, 0, -1))
    return [json.loads(raw)["headers"]["argsrepr"] for raw in queued]


@pytest.mark.django_db(transaction=True)  # the wake-up goes out after commit
@pytest.mark.usefixtures("_empty_engine_queue")
def test_a_repeated_tool_output_wakes_the_engine_again(operator: User) -> None:
    from tests.helpers import api_client

    turn = factories.turn(factories.session(owner=operator), input="ask the client")
    step = factories.step(turn, tool_name="lookup_customer", call_id="call_1")
    Step.objects.filter(pk=step.pk).update(status="running")  # a client call waiting: running, no lease
    api = api_client(operator)
    for expected in (1, 2):
        response = api.post(f"/api/sessions/{turn.session_id}/tool-outputs", {"call_id": "call_1", "output": "ok"},
                            content_type="application/json")
        assert response.status_code == 200
        assert _ticks_queued() == [repr([str(turn.id)])] * expected
    assert Event.objects.filter(step_id=step.id, type="tool.output_submitted").count() == 1
