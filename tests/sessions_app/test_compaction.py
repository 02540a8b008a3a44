"""Compaction: the prompt stays under the window, pinned context verbatim, recent steps whole; a
compaction step is a durable model step (re-run after a crash, applied once); the provider's
context overflow compacts and retries once, then fails with ``context_overflow``.

Against the database, the model gateway (in-process ``turn_drive`` or the real gateway thread
with a Celery worker) and a scripted model with a context window over HTTP."""

import asyncio
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone

from approvals_app.services import approval_decide
from scripted_model.server import ScriptedModelServer, start_in_thread
from sessions_app.engine import llm
from sessions_app.engine.commands import session_start, turn_submit
from sessions_app.engine.compaction import COMPACTION_MARKER, compaction_record_atomic
from sessions_app.engine.context import compaction_range, messages_tokens, prompt_estimate
from sessions_app.engine.gateway import turn_drive_once
from sessions_app.engine.prompt import SUMMARY_HEADER, build_messages, system_prompt
from sessions_app.engine.recovery import sweep
from sessions_app.engine.tick import turn_tick
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from sessions_app.services import session_compact_request, session_create, session_pinned_update, turn_create
from tests import factories
from tests.helpers import api_client, assert_gap_free, finished, login, pending_approvals, tool

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW = 4000
BIG = "".join(f"line {i:04d} of the big file, with some padding to make it long\n" for i in range(60))  # ~3.9k chars
# No acceptance criteria here: a verification step would join every turn (tests/sessions_app/test_verification.py).
PINNED = {"requirements": ["Keep the API backwards compatible (REQ-7f3a)."],
          "prohibitions": ["Never touch the production database (PRO-91c2)."]}


@pytest.fixture(autouse=True)
def _database_on_the_loop_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")


@pytest.fixture(scope="module")
def windowed_model() -> Iterator[ScriptedModelServer]:
    """A scripted model that refuses prompts over WINDOW tokens with OpenAI's 400."""
    server, _url = start_in_thread(port=0, context_window=WINDOW)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def owner(transactional_db: None) -> User:
    return factories.user("cora", groups=["operators"])


def _agent(server: ScriptedModelServer, **fields: Any) -> AgentProfile:
    from tools_app.models import ToolDefinition
    from tools_app.services import tool_definitions_seed

    tool_definitions_seed()
    defaults: dict[str, Any] = {"context_window": WINDOW, "compaction_threshold": 0.8, "keep_recent_steps": 4,
                                "starter_files": {"big.txt": BIG}}
    profile = factories.agent_profile(base_url=server.base_url, model="scripted", **{**defaults, **fields})
    profile.tools.set(ToolDefinition.objects.all())
    return profile


def _run(turn_id: Any) -> None:
    """Drive a turn in this process as the gateway does, its database work on this thread. The
    loop's context has its own connection: handed back to the pool here, or each run keeps one."""
    async def go() -> None:
        try:
            await turn_drive_once(turn_id, db_in_loop=True)
        finally:
            connections.close_all()
    asyncio.run(go())


def _drive(agent: AgentProfile, owner: User, text: str) -> Turn:
    session = session_create(agent=agent, owner=owner, title="compaction", pinned=PINNED)
    turn = turn_create(session_id=session.id, input=text, actor=owner)
    _run(turn.id)
    return Turn.objects.get(pk=turn.pk)


def _sent(server: ScriptedModelServer, after: int) -> list[Any]:
    return server.logged_requests(after=after)


def test_compaction_keeps_every_request_under_the_window_with_pinned_context_verbatim(
        windowed_model: ScriptedModelServer, owner: User) -> None:
    agent = _agent(windowed_model)
    after = windowed_model.request_log.last_seq
    reads = 10
    turn = _drive(agent, owner, "\n".join([tool("read_file", path="big.txt")] * reads + ["say finished {results}"]))
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    # The script played through, line by line: the summaries carried its position.
    assert turn.output_text.startswith("finished")
    sent = _sent(windowed_model, after)
    chats = [e for e in sent if e.purpose == "chat"]
    compactions = [e for e in sent if e.purpose == "compaction"]
    assert len(chats) == reads + 1
    assert len(compactions) >= 2
    assert all(e.status == 200 and e.prompt_tokens <= WINDOW for e in sent)
    # Without compaction the last call would have carried ten files (~10k tokens): over the window.
    assert max(e.prompt_tokens for e in chats) < WINDOW * 0.8 + 1100
    pinned = [item for items in PINNED.values() for item in items]
    assert all(all(item in e.system for item in pinned) for e in sent)  # the compactions' too
    assert all(COMPACTION_MARKER in e.system for e in compactions)

    steps = list(Step.objects.filter(turn=turn, kind="compaction").order_by("index"))
    assert len(steps) == len(compactions)
    for step in steps:
        assert step.status == "completed" and step.attempts == 1 and step.result is not None
        assert step.result["tokens_after"] < step.result["tokens_before"]
        assert set(step.result["summary"]) >= {"goal", "decisions", "facts", "files", "open_questions",
                                               "tried_and_failed"}
        assert step.arguments["reason"] == "threshold"
    events = Event.objects.filter(session_id=turn.session_id, type="session.compacted").order_by("seq")
    assert [e.step_id for e in events] == [s.id for s in steps]
    assert events[0].payload["summary"]["files"] == ["big.txt"]
    # Nothing deleted: every read is still a step of the turn.
    assert Step.objects.filter(turn=turn, kind="tool", status="completed").count() == reads
    assert_gap_free(turn.session_id)


def test_compaction_prompt_is_pinned_summary_then_recent_steps_whole(
        windowed_model: ScriptedModelServer, owner: User) -> None:
    agent = _agent(windowed_model)
    turn = _drive(agent, owner, "\n".join([tool("read_file", path="big.txt")] * 6 + ["say done"]))
    assert turn.status == "completed"
    session = AgentSession.objects.select_related("agent").get(pk=turn.session_id)
    messages = build_messages(session)
    assert messages[0] == {"role": "system", "content": system_prompt(session)}
    assert "REQ-7f3a" in messages[0]["content"] and "PRO-91c2" in messages[0]["content"]
    # The cut lies inside this turn: its input stays whole, then the summary, then recent steps.
    assert messages[1] == {"role": "user", "content": turn.input}
    assert messages[2]["role"] == "system" and messages[2]["content"].startswith(SUMMARY_HEADER)
    assert messages[3]["role"] == "assistant"  # a group starts whole: the call, then its result
    kept_calls = {c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []}
    assert {m["tool_call_id"] for m in messages if m["role"] == "tool"} == kept_calls
    full = build_messages(session, latest=False)
    assert len(full) > len(messages)
    assert full[-len(messages) + 3:] == messages[3:]  # the recent history is the same messages, whole


def test_compaction_estimate_is_previous_prompt_tokens_plus_added_characters(
        windowed_model: ScriptedModelServer, owner: User) -> None:
    agent = _agent(windowed_model, context_window=None)
    after = windowed_model.request_log.last_seq
    turn = _drive(agent, owner, "\n".join([tool("read_file", path="big.txt")] * 2 + ["say done"]))
    assert turn.status == "completed"
    last_call = _sent(windowed_model, after)[-1]
    session = AgentSession.objects.select_related("agent").get(pk=turn.session_id)
    # What the model reported for the last call, plus its reply: the estimate of the next prompt.
    estimate = prompt_estimate(session.id, len(system_prompt(session)) + 6)
    measured = messages_tokens(build_messages(session))
    assert last_call.prompt_tokens <= estimate
    assert abs(estimate - measured) <= 5
    assert not Step.objects.filter(session=session, kind="compaction").exists()  # no window: never


def test_compaction_context_overflow_compacts_and_retries_once(
        windowed_model: ScriptedModelServer, owner: User) -> None:
    # The profile thinks the window is large: only the provider's 400 tells the engine.
    agent = _agent(windowed_model, context_window=100_000)
    after = windowed_model.request_log.last_seq
    turn = _drive(agent, owner, "\n".join([tool("read_file", path="big.txt")] * 5 + ["say made it"]))
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert turn.output_text == "made it"
    sent = _sent(windowed_model, after)
    refused = [e for e in sent if e.status == 400]
    assert refused and all(e.prompt_tokens > WINDOW for e in refused)
    failed = Step.objects.filter(turn=turn, kind="model", status="failed")
    assert {s.error_code for s in failed} == {"context_length_exceeded"}
    compactions = Step.objects.filter(turn=turn, kind="compaction", status="completed")
    assert compactions.count() == len(refused)
    assert {s.arguments["reason"] for s in compactions} == {"overflow"}
    # Each refused call was followed by a compaction and a retry that succeeded.
    types = list(Event.objects.filter(session_id=turn.session_id, type__in=[
        "model.failed", "session.compacted"]).order_by("seq").values_list("type", flat=True))
    assert types == ["model.failed", "session.compacted"] * len(refused)


def test_compaction_context_overflow_with_nothing_to_compact_fails_with_a_clear_code(
        windowed_model: ScriptedModelServer, owner: User) -> None:
    agent = _agent(windowed_model, context_window=100_000)
    turn = _drive(agent, owner, "say hi\n" + "x" * (WINDOW * 5))
    assert turn.status == "failed"
    assert turn.error_code == "context_overflow"
    assert "context window" in turn.error_message
    assert not Step.objects.filter(turn=turn, kind="compaction").exists()


def test_compaction_still_too_long_after_compacting_fails_with_a_clear_code(
        windowed_model: ScriptedModelServer, owner: User) -> None:
    # Recent steps alone overflow: two huge reads kept whole (keep_recent_steps=4), then the retry fails.
    agent = _agent(windowed_model, context_window=100_000, starter_files={"big.txt": BIG * 3})
    turn = _drive(agent, owner, "\n".join([tool("read_file", path="big.txt")] * 3 + ["say never"]))
    assert turn.status == "failed"
    assert turn.error_code == "context_overflow"
    assert Step.objects.filter(turn=turn, kind="compaction", status="completed").count() == 1
    assert Step.objects.filter(turn=turn, kind="model", status="failed").count() == 2


def test_a_failed_compaction_ahead_of_the_window_lets_the_turn_go_on(
        windowed_model: ScriptedModelServer, owner: User) -> None:
    """An audit: the compaction call answered 400 and the user's turn failed (model_error, not
    retryable) although its prompt still fit; nothing said it was the compaction. A compaction
    ahead of the window is an optimisation: the turn goes on with its whole history."""
    agent = _agent(windowed_model, context_window=3000)  # compacts from 2,400; the model takes 4,000
    windowed_model.refuse_purposes = {"compaction": 400}
    try:
        after = windowed_model.request_log.last_seq
        turn = _drive(agent, owner, "\n".join([tool("read_file", path="big.txt")] * 3 + ["say made it"]))
        sent = _sent(windowed_model, after)
    finally:
        windowed_model.refuse_purposes = {}
    assert turn.status == "completed" and turn.output_text == "made it", (turn.error_code, turn.error_message)
    assert "compaction" in [e.purpose for e in sent if e.status == 400]
    (failed,) = Step.objects.filter(turn=turn, kind="compaction")
    assert failed.status == "failed" and failed.arguments["reason"] == "threshold"


def test_a_failed_compaction_after_an_overflow_fails_the_turn_saying_so(
        windowed_model: ScriptedModelServer, owner: User) -> None:
    agent = _agent(windowed_model, context_window=100_000)  # only the provider's 400 tells the engine
    windowed_model.refuse_purposes = {"compaction": 400}
    try:
        turn = _drive(agent, owner, "\n".join([tool("read_file", path="big.txt")] * 5 + ["say never"]))
    finally:
        windowed_model.refuse_purposes = {}
    assert turn.status == "failed"
    assert turn.error_message.startswith("The compaction call failed (the prompt does not fit"), turn.error_message


def test_compaction_step_rerun_after_a_crash_is_applied_once(
        windowed_model: ScriptedModelServer, owner: User, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = _agent(windowed_model)
    session = session_create(agent=agent, owner=owner, title="crash", pinned=PINNED)
    text = "\n".join([tool("read_file", path="big.txt")] * 5 + ["say survived"])
    turn = turn_create(session_id=session.id, input=text, actor=owner)
    # Drive until a compaction is claimed; the worker that claimed it "dies" there.
    original = llm.call_model
    dead: dict[str, Step] = {}

    async def dies_on_compaction(**kwargs: Any) -> llm.ModelReply:
        if COMPACTION_MARKER in kwargs["messages"][0]["content"] and not dead:
            dead["step"] = Step.objects.get(session=session, kind="compaction")
            raise asyncio.CancelledError
        return await original(**kwargs)

    monkeypatch.setattr(llm, "call_model", dies_on_compaction)
    with pytest.raises(asyncio.CancelledError):
        _run(turn.id)
    monkeypatch.setattr(llm, "call_model", original)
    crashed = dead["step"]
    assert Step.objects.get(pk=crashed.pk).status == "running"
    # Its lease expires; the sweeper sends it back to planned, and a fresh gateway re-runs it.
    Step.objects.filter(pk=crashed.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert sweep()["steps_recovered"] == 1
    assert Step.objects.get(pk=crashed.pk).status == "planned"
    # Another worker (thread) claims the re-run; the dead worker's late answer arrives meanwhile
    # and changes nothing: only the lease holder's write applies.
    claimed: list[Any] = []
    def claim() -> None:
        claimed.append(turn_tick(turn.id, calls_models=True))
        connections.close_all()

    other = threading.Thread(target=claim)
    other.start()
    other.join(10)
    assert claimed and claimed[0].step.id == crashed.pk and claimed[0].step.lease_owner != crashed.lease_owner
    late = llm.ModelReply(content=json.dumps({"goal": "stale"}), prompt_tokens=1, completion_tokens=1)
    assert compaction_record_atomic(crashed, late) is False
    assert Step.objects.get(pk=crashed.pk).status == "running" and Step.objects.get(pk=crashed.pk).result is None
    # That worker dies too; the third attempt completes the turn.
    Step.objects.filter(pk=crashed.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert sweep()["steps_recovered"] == 1
    _run(turn.id)
    turn = Turn.objects.get(pk=turn.pk)
    assert turn.status == "completed" and turn.output_text == "survived"
    rerun = Step.objects.get(pk=crashed.pk)
    assert rerun.status == "completed" and rerun.attempts == 3
    assert rerun.result is not None and rerun.result["summary"]["goal"] != "stale"
    compacted = Event.objects.filter(session=session, type="session.compacted")
    assert compacted.filter(step_id=crashed.pk).count() == 1
    assert_gap_free(session.id)


def test_compaction_range_keeps_groups_whole(windowed_model: ScriptedModelServer, owner: User) -> None:
    agent = _agent(windowed_model, context_window=None)
    turn = _drive(agent, owner, "\n".join(["parallel", tool("read_file", path="big.txt"),
                                           tool("read_file", path="big.txt"), tool("read_file", path="big.txt"),
                                           "end", tool("read_file", path="big.txt"), "say ok"]))
    assert turn.status == "completed"
    steps = [(s.index, s.kind) for s in Step.objects.filter(turn=turn).order_by("index")]
    assert steps == [(0, "model"), (1, "tool"), (2, "tool"), (3, "tool"), (4, "model"), (5, "tool"), (6, "model")]
    # Keep 2 (the answer and the last result): the cut moves back before the call of that result.
    rng = compaction_range(turn.session_id, 2)
    assert rng is not None and (rng.start, rng.through) == ((turn.index, -1), (turn.index, 3))
    # Keep 5: the cut would land between the parallel results; it moves back before their call.
    rng = compaction_range(turn.session_id, 5)
    assert rng is not None and rng.through == (turn.index, -1)
    assert compaction_range(turn.session_id, 8) is None  # nothing older than the steps kept


def test_compaction_with_real_workers_across_turns(
        windowed_model: ScriptedModelServer, owner: User, workers: None) -> None:
    """The real gateway (Redis stream) and a Celery worker: compactions across several turns; the
    later turn's prompt carries the summary before its own input."""
    agent = _agent(windowed_model)
    after = windowed_model.request_log.last_seq
    session, first = session_start(agent=agent, owner=owner, title="turns",
                                   input="\n".join([tool("read_file", path="big.txt")] * 4 + ["say one"]),
                                   pinned=PINNED)
    assert first is not None and finished(first).status == "completed"
    second = turn_submit(session_id=session.id, input="\n".join(
        [tool("read_file", path="big.txt")] * 3 + ["say two"]), actor=owner)
    second = finished(second)
    assert second.status == "completed" and second.output_text == "two"
    sent = _sent(windowed_model, after)
    assert all(e.status == 200 and e.prompt_tokens <= WINDOW for e in sent)
    assert Step.objects.filter(session=session, kind="compaction", status="completed").count() >= 2
    assert_gap_free(session.id)


# --- operators: compact now, edit the pinned context -------------------------------------------


def test_compaction_operator_compact_now_api_then_the_next_turn_compacts_first(
        windowed_model: ScriptedModelServer, owner: User, reviewer: User) -> None:
    agent = _agent(windowed_model, context_window=None)  # no window: only the operator asks
    first = _drive(agent, owner, "\n".join([tool("read_file", path="big.txt")] * 3 + ["say one"]))
    assert first.status == "completed"
    session_id = first.session_id
    assert api_client(reviewer).post(f"/api/sessions/{session_id}/compact").status_code == 403
    api = api_client(owner)
    response = api.post(f"/api/sessions/{session_id}/compact")
    assert response.status_code == 202 and response.json()["compact_requested"] is True
    assert api.post(f"/api/sessions/{session_id}/compact").status_code == 202  # a replay: one request
    assert Event.objects.filter(session_id=session_id, type="session.compact_requested").count() == 1
    after = windowed_model.request_log.last_seq
    second = turn_create(session_id=session_id, input="say two", actor=owner)
    _run(second.id)
    second = Turn.objects.get(pk=second.pk)
    assert second.status == "completed" and second.output_text == "two"
    assert [e.purpose for e in _sent(windowed_model, after)] == ["compaction", "chat"]
    (step,) = Step.objects.filter(session_id=session_id, kind="compaction")
    assert step.turn_id == second.id and step.index == 0 and step.arguments["reason"] == "operator"
    session = AgentSession.objects.get(pk=session_id)
    assert session.compact_requested is False
    assert api.get(f"/api/sessions/{session_id}").json()["compact_requested"] is False


def test_compaction_operator_edits_pinned_context_mid_session(
        windowed_model: ScriptedModelServer, owner: User, workers: None) -> None:
    """The real gateway and worker: a turn waits for an approval, the operator edits the pinned
    context, the reviewer approves; the next model call carries the new pinned items verbatim."""
    agent = _agent(windowed_model, context_window=None)
    session, turn = session_start(agent=agent, owner=owner, title="pinned", pinned=PINNED, input="\n".join([
        tool("write_file", path="notes.txt", content="x"), "say written"]))
    assert turn is not None
    (approval,) = pending_approvals(turn)
    api = api_client(owner)
    body = {"requirements": ["Ship behind the flag NEW-REQ-1."], "prohibitions": ["Do not email customers NEW-PRO-2."]}
    response = api.put(f"/api/sessions/{session.id}/pinned", body, content_type="application/json")
    assert response.status_code == 200, response.content
    out = response.json()
    assert out["pinned"] == {**body, "acceptance_criteria": []}
    assert out["pinned_revision"] == 1
    again = api.put(f"/api/sessions/{session.id}/pinned", body, content_type="application/json")
    assert again.json()["pinned_revision"] == 1  # the same values: no change, no event
    (changed,) = Event.objects.filter(session=session, type="session.pinned_changed")
    assert changed.turn_id == turn.id
    assert changed.payload["before"]["requirements"] == PINNED["requirements"]
    assert changed.payload["after"]["requirements"] == body["requirements"] and changed.payload["by"] == owner.username
    after = windowed_model.request_log.last_seq
    approval_decide(request_id=approval.request_id, actor=factories.user("rita", groups=["reviewers"]),
                    decision="approve")
    assert finished(turn).status == "completed"
    (next_call,) = _sent(windowed_model, after)
    assert "NEW-REQ-1" in next_call.system and "NEW-PRO-2" in next_call.system
    assert "REQ-7f3a" not in next_call.system and "PRO-91c2" not in next_call.system
    bad = api.put(f"/api/sessions/{session.id}/pinned", {"goals": ["x"]}, content_type="application/json")
    assert bad.status_code in (400, 422)


def test_compaction_pinned_edit_inline_worker_rebuilds_its_prompt(
        windowed_model: ScriptedModelServer, owner: User, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker running read-only calls inline holds the prompt in memory: an edit made meanwhile
    reaches the very next call (the write returns a new pinned_revision, the tick takes over)."""
    agent = _agent(windowed_model, context_window=None)
    session = session_create(agent=agent, owner=owner, title="inline edit", pinned=PINNED)
    turn = turn_create(session_id=session.id, input="\n".join([tool("list_files", path=".")] * 3 + ["say ok"]),
                       actor=owner)
    original = llm.call_model
    calls = 0

    async def edit_during_first_call(**kwargs: Any) -> llm.ModelReply:
        nonlocal calls
        calls += 1
        if calls == 1:
            session_pinned_update(session_id=session.id, actor=owner, pinned={"requirements": ["EDITED-REQ"]})
        return await original(**kwargs)

    monkeypatch.setattr(llm, "call_model", edit_during_first_call)
    after = windowed_model.request_log.last_seq
    _run(turn.id)
    assert Turn.objects.get(pk=turn.pk).status == "completed"
    sent = _sent(windowed_model, after)
    assert len(sent) == 4
    assert "REQ-7f3a" in sent[0].system
    assert all("EDITED-REQ" in e.system and "REQ-7f3a" not in e.system for e in sent[1:])


def test_compaction_card_and_pinned_note_on_the_session_page(
        windowed_model: ScriptedModelServer, owner: User) -> None:
    agent = _agent(windowed_model)
    turn = _drive(agent, owner, "\n".join([tool("read_file", path="big.txt")] * 6 + ["say done"]))
    session_pinned_update(session_id=turn.session_id, actor=owner, pinned={"prohibitions": ["NOTE-PRO-9"]})
    session_compact_request(session_id=turn.session_id, actor=owner)
    page = login(owner).get(f"/sessions/{turn.session_id}/").content.decode()
    step = Step.objects.filter(turn=turn, kind="compaction").first()
    assert step is not None and step.result is not None
    assert f'id="step-{step.id}"' in page and "Compaction" in page
    assert f"{step.result['tokens_before']} → {step.result['tokens_after']} tokens" in page
    assert "<details class=\"summary\">" in page and "big.txt" in page  # the summary, expandable
    assert "session.pinned_changed" in page and "NOTE-PRO-9" in page
    assert "Compaction pending" in page and "Edit pinned context" in page
    client = login(owner)
    response = client.post(f"/sessions/{turn.session_id}/pinned/", {
        "requirements": "one\ntwo", "prohibitions": "", "acceptance_criteria": "done when green"})
    assert response.status_code == 302
    session = AgentSession.objects.get(pk=turn.session_id)
    assert (session.requirements, session.prohibitions, session.acceptance_criteria) == (
        ["one", "two"], [], ["done when green"])
    assert session.pinned_revision == 2
