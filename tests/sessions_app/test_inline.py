"""The engine's inline path: read-only tool calls run where the model step ran and are recorded
with the reply in one write. Driven in-process through the model gateway's ``turn_drive``
against the database and the scripted model over HTTP; cancel and approvals through a real
Celery worker."""

import asyncio
import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_decide
from sessions_app.engine import llm
from sessions_app.engine.commands import session_cancel, session_start
from sessions_app.engine.gateway import turn_drive_once
from sessions_app.engine.prompt import build_messages
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from sessions_app.services import session_create, turn_create
from tests import factories
from tests.helpers import assert_gap_free, statements_sent, tool
from tests.waiting import wait_for
from tools_app.selectors import tool_definitions_cache_clear

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _database_on_the_loop_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_turn`` drives the gateway with its database work on the test's own thread, so the
    queries are counted there (Django refuses that from an event loop unless told)."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")


@pytest.fixture
def owner(transactional_db: None) -> User:
    return factories.user("olga", groups=["operators"])


def run_turn(agent: AgentProfile, owner: User, text: str, *, on_session: dict[str, AgentSession] | None = None,
             **budget: int) -> Turn:
    """Create a session and a turn and drive it in this process, as the model gateway does."""
    session = session_create(agent=agent, owner=owner, title="inline", budget=budget or None)
    if on_session is not None:
        on_session["session"] = session
    turn = turn_create(session_id=session.id, input=text, actor=owner)
    asyncio.run(turn_drive_once(turn.id, db_in_loop=True))
    return Turn.objects.get(pk=turn.pk)


def engine_events(session_id: Any) -> list[str]:
    return [t for t in Event.objects.filter(session_id=session_id).order_by("seq").values_list("type", flat=True)
            if t.split(".")[0] in ("model", "tool") and t != "model.delta"]


def test_inline_read_only_turn_records_every_step_and_counter(engine_agent: AgentProfile, owner: User) -> None:
    engine_agent.starter_files = {"notes/a.txt": "alpha\n", "notes/b.txt": "beta\n"}
    engine_agent.save()
    turn = run_turn(engine_agent, owner, "\n".join([
        tool("list_files", path="notes"),
        "parallel", tool("read_file", path="notes/a.txt"), tool("read_file", path="notes/b.txt"), "end",
        tool("list_files", path="missing"),
        "say seen: {results}"]))
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert "read_file: alpha" in turn.output_text and "read_file: beta" in turn.output_text
    assert "list_files: [error:" in turn.output_text  # a failed read-only call is reported, the turn goes on
    assert engine_events(turn.session_id) == [
        "model.started", "model.completed", "tool.started", "tool.completed",
        "model.started", "model.completed", "tool.started", "tool.completed", "tool.started", "tool.completed",
        "model.started", "model.completed", "tool.started", "tool.failed",
        "model.started", "model.completed"]
    steps = list(Step.objects.filter(turn=turn).order_by("index"))
    assert [s.index for s in steps] == list(range(len(steps)))
    assert [(s.kind, s.status) for s in steps] == [
        ("model", "completed"), ("tool", "completed"), ("model", "completed"), ("tool", "completed"),
        ("tool", "completed"), ("model", "completed"), ("tool", "failed"), ("model", "completed")]
    assert all(s.lease_owner == "" and s.lease_expires_at is None and s.finished_at for s in steps)
    assert all(s.attempts == 1 and s.approval_mode == "safe_readonly" for s in steps if s.kind == "tool")
    session = AgentSession.objects.get(pk=turn.session_id)
    model_steps = [s for s in steps if s.kind == "model"]
    assert (session.tool_calls, session.model_calls) == (4, 4)
    assert session.prompt_tokens == sum(s.prompt_tokens for s in model_steps) == turn.prompt_tokens > 0
    assert session.completion_tokens == sum(s.completion_tokens for s in model_steps) == turn.completion_tokens
    assert session.status == "idle"
    assert not ApprovalRequest.objects.filter(session=session).exists()
    assert_gap_free(turn.session_id)


def test_inline_history_kept_in_memory_is_what_the_database_holds(engine_agent: AgentProfile, owner: User,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each model call gets the history the worker kept in memory; it must equal a rebuild from the
    database at that moment (what a fresh worker would send)."""
    seen: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
    call_model = llm.call_model

    session_of_turn: dict[str, AgentSession] = {}

    async def spy(**kwargs: Any) -> llm.ModelReply:
        (session,) = session_of_turn.values()
        seen.append((json.loads(json.dumps(kwargs.get("messages"))), build_messages(session)))
        return await call_model(**kwargs)

    monkeypatch.setattr(llm, "call_model", spy)
    engine_agent.starter_files = {"a.txt": "one\n"}
    engine_agent.save()
    turn = run_turn(engine_agent, owner, "\n".join([
        tool("list_files", path="."), "parallel", tool("read_file", path="a.txt"), tool("list_files", path="."),
        "end", tool("read_file", path="nope.txt"), "say ok"]), on_session=session_of_turn)
    assert turn.status == "completed"
    assert len(seen) == 4
    for in_memory, rebuilt in seen:
        assert in_memory == rebuilt
    assert len(seen[-1][0]) == 2 + 2 + 3 + 2  # system, user, then each reply with its results (1, 2, 1 calls)


def engine_statements(sent: list[str]) -> list[str]:
    """The statements of the engine's own rows: without the refills of the short-lived caches of
    tool definitions, sandbox hosts and the team's secrets (they expire on their own clocks), nor
    the commits of transactions that held only those."""
    kept: list[str] = []
    pending = False
    for sql in sent:
        if sql.startswith("BEGIN"):  # SQLite's BEGIN IMMEDIATE: counted with its COMMIT
            continue
        if sql == "COMMIT":
            if pending:
                kept.append(sql)
            pending = False
        elif not any(f'FROM "{table}' in sql for table in ("tools_app_", "hosts_app_", "vault_app_")):
            kept.append(sql)
            pending = True
    return kept


def hold_streamed_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway writes a reply's streamed text every DELTA_INTERVAL_SECONDS (100 ms) while it
    streams: a scripted reply slower than that (a loaded CI machine) wrote one more model.delta, and
    a count of the statements around the calls failed at random (CI, 2026-12-03). Counts hold the
    text to the reply's own write."""
    monkeypatch.setattr(llm, "DELTA_INTERVAL_SECONDS", 3600.0)


def test_inline_writes_per_step_stay_flat_as_the_history_grows(engine_agent: AgentProfile, owner: User,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    hold_streamed_text(monkeypatch)

    def statements(n: int) -> int:
        # Start each run with the short-lived caches of tool definitions empty: every run refills them alike.
        tool_definitions_cache_clear()
        with statements_sent() as sent:
            turn = run_turn(engine_agent, owner, "\n".join([tool("list_files", path=".")] * n + ["say done"]))
        assert turn.status == "completed"
        return len(engine_statements(sent))

    q4, q12, q20 = statements(4), statements(12), statements(20)
    per_step = (q12 - q4) / 8
    assert q20 - q12 == q12 - q4, (q4, q12, q20)  # the same cost for step 5 and step 20
    assert per_step >= 1  # the gateway's writes are counted (the loop's own connection, not only this thread's)
    if connection.vendor == "postgresql":
        assert per_step == 2, per_step  # one statement, COMMIT


def test_inline_parallel_calls_that_would_cross_the_tool_budget_hand_over(engine_agent: AgentProfile,
                                                                         owner: User) -> None:
    turn = run_turn(engine_agent, owner, "\n".join([
        "parallel", tool("list_files", path="."), tool("list_files", path="."), tool("list_files", path="."), "end",
        "say never"]), max_tool_calls=2)
    assert turn.status == "failed" and turn.error_code == "budget_exceeded"
    statuses = list(Step.objects.filter(turn=turn, kind="tool").order_by("index").values_list("status", flat=True))
    assert statuses == ["completed", "completed", "failed"]
    event = Event.objects.get(session_id=turn.session_id, type="budget.exceeded")
    assert event.payload["budget"] == "max_tool_calls"
    assert AgentSession.objects.get(pk=turn.session_id).tool_calls == 2
    assert_gap_free(turn.session_id)


def test_inline_model_call_budget_stops_before_the_next_call(engine_agent: AgentProfile, owner: User) -> None:
    turn = run_turn(engine_agent, owner, "\n".join([tool("list_files", path=".")] * 3 + ["say never"]),
                    max_model_calls=2)
    assert turn.status == "failed" and turn.error_code == "budget_exceeded"
    assert Event.objects.get(session_id=turn.session_id, type="budget.exceeded").payload["budget"] == "max_model_calls"
    steps = list(Step.objects.filter(turn=turn).order_by("index").values_list("kind", "status"))
    assert steps == [("model", "completed"), ("tool", "completed"), ("model", "completed"), ("tool", "completed")]
    assert_gap_free(turn.session_id)


@pytest.mark.usefixtures("workers")
@pytest.mark.gateway_watch(60)  # the reply must come back to be dropped (not be let go of first)
def test_inline_cancel_while_the_model_answers_records_nothing_after_it(engine_agent: AgentProfile,
                                                                        owner: User) -> None:
    session, turn = session_start(agent=engine_agent, owner=owner, input="\n".join([
        tool("list_files", path="."), "sleep 3000", tool("list_files", path="."), "say never"]))
    assert turn is not None
    wait_for(lambda: Event.objects.filter(session=session, type="tool.completed").exists(), 30, "the first result")
    wait_for(lambda: Step.objects.filter(turn=turn, kind="model", index=2, status="running").exists(), 30,
             "the second model call")
    session_cancel(session_id=session.id, actor=owner)
    # The reply arrives after the cancel: its write finds the step cancelled, keeps nothing of it,
    # and says so (the barrier: the worker got past the point where it would have recorded it).
    wait_for(lambda: Event.objects.filter(session=session, type="model.cancelled").exists(), 30, "the cancel")
    dropped = wait_for(lambda: Event.objects.filter(session=session, type="model.reply_dropped").first(), 30,
                       "the late reply to be dropped")
    assert dropped.payload["status"] == "cancelled" and dropped.payload["index"] == 2
    assert Turn.objects.get(pk=turn.pk).status == "cancelled"
    steps = list(Step.objects.filter(turn=turn).order_by("index").values_list("kind", "status"))
    assert steps == [("model", "completed"), ("tool", "completed"), ("model", "cancelled")]
    assert Event.objects.filter(session=session, type="model.completed").count() == 1
    assert AgentSession.objects.get(pk=session.pk).status == "idle"
    assert_gap_free(session.id)


@pytest.mark.usefixtures("workers")
def test_inline_batch_with_a_mutating_call_goes_through_the_gate(engine_agent: AgentProfile, owner: User) -> None:
    reviewer = factories.user("ruth", groups=["reviewers"])
    session, turn = session_start(agent=engine_agent, owner=owner, input="\n".join([
        "parallel", tool("list_files", path="."), tool("run_command", command="echo hi"), "end",
        "say got: {results}"]))
    assert turn is not None
    approval = wait_for(lambda: ApprovalRequest.objects.filter(turn=turn, status="pending").first(), 30,
                        "the approval request")
    assert approval.tool_name == "run_command"
    approval_decide(request_id=approval.request_id, actor=reviewer, decision="approve",
                    seen_hash=approval.arguments_sha256)
    done = wait_for(lambda: (lambda t: t if not t.is_active else None)(Turn.objects.get(pk=turn.pk)), 60,
                    "the turn to finish")
    assert done.status == "completed", (done.error_code, done.error_message)
    assert "list_files:" in done.output_text and "run_command: hi" in done.output_text
    assert_gap_free(session.id)


def test_a_turn_costs_a_fixed_number_of_statements_around_its_model_calls(
        engine_agent: AgentProfile, owner: User, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a turn costs besides its model calls: the tick that starts it and claims the first call
    (one transaction), and the record of the final answer with the tick that completes the turn
    (one transaction); each read-only call in between adds one statement and its commit."""
    hold_streamed_text(monkeypatch)
    def statements(script: str) -> list[str]:
        session = session_create(agent=engine_agent, owner=owner, title="cost")
        turn = turn_create(session_id=session.id, input=script, actor=owner)
        with statements_sent() as sent:
            asyncio.run(turn_drive_once(turn.id, db_in_loop=True, session_id=session.id))
        assert Turn.objects.get(pk=turn.pk).status == "completed"
        return engine_statements(sent)

    answer_only = statements("say done")
    with_reads = statements("\n".join([tool("list_files", path=".")] * 3 + ["say done"]))
    assert answer_only.count("COMMIT") == 2, answer_only
    assert with_reads.count("COMMIT") == 2 + 3, with_reads
    if connection.vendor == "postgresql":
        assert len(answer_only) <= 18, "\n".join(answer_only)
        assert len(with_reads) - len(answer_only) == 3 * 2, "\n".join(with_reads)


def test_a_reply_takes_one_trip_through_the_gateways_database_threads(
        engine_agent: AgentProfile, owner: User, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy gateway's replies queue for its few database threads: each trip waits behind the
    others' work. A reply whose session has no prohibitions has nothing to check and makes one
    trip, its record; with prohibitions, the calls a reviewer may see are picked there first."""
    from sessions_app.engine import gateway as gateway_module
    from sessions_app.engine.prohibitions import calls_to_check

    trips: list[str] = []
    db = gateway_module.Gateway._db

    async def counted(self: gateway_module.Gateway, fn: Any, args: Any, kwargs: Any, *, first: bool) -> Any:
        trips.append(getattr(fn, "__name__", repr(fn)))
        return await db(self, fn, args, kwargs, first=first)

    monkeypatch.setattr(gateway_module.Gateway, "_db", counted)
    hold_streamed_text(monkeypatch)
    script = "\n".join([tool("list_files", path=".")] * 2 + ["say done"])
    session = session_create(agent=engine_agent, owner=owner, title="trips")
    turn = turn_create(session_id=session.id, input=script, actor=owner)
    asyncio.run(turn_drive_once(turn.id, db_in_loop=True, session_id=session.id))
    assert Turn.objects.get(pk=turn.pk).status == "completed"
    assert trips == ["_tick_and_load", "model_reply_apply", "model_reply_apply", "model_reply_apply"], trips

    trips.clear()
    session = session_create(agent=engine_agent, owner=owner, title="trips, prohibited",
                             pinned={"prohibitions": ["Never delete anything."]})
    turn = turn_create(session_id=session.id, input=script, actor=owner)
    asyncio.run(turn_drive_once(turn.id, db_in_loop=True, session_id=session.id))
    assert Turn.objects.get(pk=turn.pk).status == "completed"
    assert trips.count(calls_to_check.__name__) == 2, trips  # the two replies with calls
