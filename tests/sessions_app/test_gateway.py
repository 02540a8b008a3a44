"""The model gateway: at-least-once hand-off over the Redis stream, one call per step whatever is
delivered twice, a gateway killed with calls in flight, and rate limits per endpoint."""

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from django.contrib.auth.models import User
from django.db import transaction

from agentops.dispatch import MODEL_GROUP, MODEL_STREAM, redis_client
from scripted_model.request_log import RequestLogEntry
from scripted_model.server import ScriptedModelServer, start_in_thread
from sessions_app.engine.commands import session_start
from sessions_app.engine.gateway import run_in_thread
from sessions_app.engine.tick import turn_tick
from sessions_app.engine.turns import turn_cancel
from sessions_app.models import AgentProfile, Event, Step, Turn
from sessions_app.services import session_create, turn_create
from tests import factories
from tests.helpers import WorkerFactory, assert_gap_free, finished, script, tool
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _empty_stream() -> Iterator[None]:
    """Each test starts and ends with no entry on the stream and no consumer group."""
    redis_client().delete(MODEL_STREAM)
    yield
    redis_client().delete(MODEL_STREAM)


@pytest.fixture
def owner(transactional_db: None) -> User:
    return factories.user("gwen", groups=["operators"])


def _requests_of(server: ScriptedModelServer, token: str) -> list[RequestLogEntry]:
    return [e for e in server.logged_requests() if token in e.last_user_message]


def _planned_model_step(agent: AgentProfile, owner: User, text: str) -> Step:
    """A turn ticked once by Celery's side: its first model step planned and put on the stream."""
    session = session_create(agent=agent, owner=owner, title="gateway")
    turn = turn_create(session_id=session.id, input=text, actor=owner)
    turn_tick(turn.id)
    return Step.objects.get(turn=turn, kind="model")


def test_gateway_entry_delivered_three_times_calls_the_model_once(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer,
        model_gateway: object) -> None:
    token = uuid.uuid4().hex
    with transaction.atomic():
        step = _planned_model_step(engine_agent, owner, f"say hello {token}")
        for _ in range(2):  # a redelivery, a retried send: the same step twice more
            transaction.on_commit(lambda: redis_client().xadd(MODEL_STREAM, {"step_id": str(step.id)}))
    turn = finished(Turn.objects.get(pk=step.turn_id))
    assert turn.status == "completed" and turn.output_text == f"hello {token}"
    wait_for(lambda: redis_client().xlen(MODEL_STREAM) == 0, 10, "every entry acknowledged and deleted")
    assert len(_requests_of(scripted_model, token)) == 1
    assert Event.objects.filter(session_id=turn.session_id, type="model.completed").count() == 1
    assert Step.objects.get(pk=step.pk).attempts == 1
    assert_gap_free(turn.session_id)


def test_gateway_takes_over_an_entry_that_a_dead_gateway_read(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer) -> None:
    token = uuid.uuid4().hex
    client = redis_client()
    client.xgroup_create(MODEL_STREAM, MODEL_GROUP, id="0", mkstream=True)
    step = _planned_model_step(engine_agent, owner, f"say taken over {token}")
    # A gateway reads the entry and dies before its tick: the entry stays pending, unacknowledged.
    read: Any = client.xreadgroup(MODEL_GROUP, "dead-gateway", {MODEL_STREAM: ">"}, count=10)
    assert [fields[b"step_id"].decode() for _, entries in read for _, fields in entries] == [str(step.id)]
    gateway, thread = run_in_thread(concurrency=10, db_threads=2, reclaim_after_seconds=0.5)
    try:
        turn = finished(Turn.objects.get(pk=step.turn_id))
    finally:
        gateway.stop_threadsafe()
        thread.join(30)
    assert turn.status == "completed" and turn.output_text == f"taken over {token}"
    pending: Any = client.xpending(MODEL_STREAM, MODEL_GROUP)
    assert pending["pending"] == 0
    assert len(_requests_of(scripted_model, token)) == 1


def test_gateway_recreates_its_group_after_redis_lost_everything(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer) -> None:
    """A Redis restarted without persistence has no stream and no consumer group: the running
    gateway read NOGROUP forever and every later model call waited (found by the chaos proof)."""
    token = uuid.uuid4().hex
    gateway, thread = run_in_thread(concurrency=10, db_threads=2, reclaim_after_seconds=0.5)
    try:
        wait_for(lambda: redis_client().exists(MODEL_STREAM) or None, timeout=10)
        redis_client().delete(MODEL_STREAM)  # what a restart of a Redis without persistence leaves
        step = _planned_model_step(engine_agent, owner, f"say after the restart {token}")
        turn = finished(Turn.objects.get(pk=step.turn_id), timeout=20)
    finally:
        gateway.stop_threadsafe()
        thread.join(30)
    assert turn.status == "completed" and turn.output_text == f"after the restart {token}"
    assert len(_requests_of(scripted_model, token)) == 1


def test_a_gateway_whose_database_threads_are_behind_leaves_new_turns_to_another(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer) -> None:
    """A gateway takes new entries only while its database threads keep up: before, two gateways
    reading 100 entries at a time split a burst of new sessions by who got the CPU first, and the
    one that took most drove them at twice the other's load (bench/concurrency.py, N = 300)."""
    token = uuid.uuid4().hex
    busy, busy_thread = run_in_thread(concurrency=10, db_threads=1, reclaim_after_seconds=30)
    release = threading.Event()
    assert busy._loop is not None
    held = [asyncio.run_coroutine_threadsafe(busy.db(release.wait, 60), busy._loop) for _ in range(2)]
    other = other_thread = None
    try:
        wait_for(lambda: busy.db_waiting == 2, 10, "the busy gateway's database thread and queue to fill")
        time.sleep(1.5)  # its read of the stream (a 1-s block) that began before has returned
        other, other_thread = run_in_thread(concurrency=10, db_threads=2, reclaim_after_seconds=30)
        step = _planned_model_step(engine_agent, owner, f"say by the other {token}")
        # The busy gateway cannot tick anything until released: only the other one can finish it.
        turn = finished(Turn.objects.get(pk=step.turn_id), timeout=15)
    finally:
        release.set()
        for future in held:
            future.result(10)
        for gateway, thread in ((busy, busy_thread), (other, other_thread)):
            if gateway is not None and thread is not None:
                gateway.stop_threadsafe()
                thread.join(30)
    assert turn.status == "completed" and turn.output_text == f"by the other {token}"
    assert len(_requests_of(scripted_model, token)) == 1


def test_a_busy_gateway_alone_still_takes_a_new_turn(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer) -> None:
    """With no other gateway to take it, a new turn is read within HOLD_MAX_SECONDS by a gateway
    whose database threads are behind, and runs once they catch up."""
    token = uuid.uuid4().hex
    busy, thread = run_in_thread(concurrency=10, db_threads=1, reclaim_after_seconds=30)
    release = threading.Event()
    assert busy._loop is not None
    held = [asyncio.run_coroutine_threadsafe(busy.db(release.wait, 60), busy._loop) for _ in range(2)]
    try:
        wait_for(lambda: busy.db_waiting == 2, 10, "the gateway's database thread and queue to fill")
        step = _planned_model_step(engine_agent, owner, f"say once caught up {token}")

        def read_by_busy() -> bool:
            pending: Any = redis_client().xpending(MODEL_STREAM, MODEL_GROUP)
            return pending["pending"] == 1 and any(c["name"].decode() == busy.name for c in pending["consumers"])

        wait_for(read_by_busy, 5, "the busy gateway to read the entry")
        assert Turn.objects.get(pk=step.turn_id).is_active  # its tick waits for a database thread
        release.set()
        turn = finished(Turn.objects.get(pk=step.turn_id), timeout=15)
    finally:
        release.set()
        for future in held:
            future.result(10)
        busy.stop_threadsafe()
        thread.join(30)
    assert turn.status == "completed" and turn.output_text == f"once caught up {token}"


def test_a_new_turn_reaches_the_model_after_one_database_call(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer) -> None:
    """The first tick and the conversation's load are one call on the database threads: as two, a
    burst of new turns queued every tick first and every load behind them, and no first model call
    went out until the whole burst was ticked (bench/concurrency.py, N = 300)."""
    token = uuid.uuid4().hex
    gateway, thread = run_in_thread(concurrency=10, db_threads=1, reclaim_after_seconds=30)
    calls: list[tuple[float, str]] = []
    db = gateway._db

    async def counted(fn: Any, args: Any, kwargs: Any, *, first: bool) -> Any:
        calls.append((time.time(), getattr(fn, "__qualname__", repr(fn))))
        return await db(fn, args, kwargs, first=first)

    gateway._db = counted  # type: ignore[method-assign]
    try:
        _, turn = session_start(agent=engine_agent, owner=owner, input=f"say first {token}")
        assert turn is not None
        turn = finished(turn, timeout=15)
    finally:
        gateway.stop_threadsafe()
        thread.join(30)
    assert turn.status == "completed" and turn.output_text == f"first {token}"
    (request,) = _requests_of(scripted_model, token)
    # The gateway's own housekeeping (the held-steps watch every 2 s, lease renewal) also runs on
    # those threads, on its own clock: on a loaded machine it can fall before the call.
    housekeeping = {"steps_still_held", "step_leases_renew"}
    before = [name for at, name in calls if at <= request.received_at and name not in housekeeping]
    assert before == ["_tick_and_load"], before


def test_gateway_killed_with_20_calls_in_flight_each_is_reissued_once(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer,
        worker_process: WorkerFactory) -> None:
    token = uuid.uuid4().hex
    first = worker_process(kind="gateway")
    worker_process(beat=True)  # ticks, and the sweeper that re-issues expired model steps
    turns = [session_start(agent=engine_agent, owner=owner,
                           input=script("sleep 2500", f"say done {token} {n}"))[1] for n in range(20)]
    before = scripted_model.stats()["in_flight"]
    wait_for(lambda: scripted_model.stats()["in_flight"] - before >= 20, 30, "20 calls in flight")
    first.kill()
    first.wait()
    worker_process(kind="gateway")
    for n, turn in enumerate(turns):
        assert turn is not None
        done = finished(turn, timeout=60)
        assert done.status == "completed" and done.output_text == f"done {token} {n}", done.error_message
        # One reply recorded per turn, by the call re-issued after the lease of the first expired.
        assert Event.objects.filter(session_id=done.session_id, type="model.completed").count() == 1
        (model_step,) = Step.objects.filter(turn=done, kind="model")
        assert model_step.attempts == 2
        assert Event.objects.filter(step_id=model_step.id, type="step.recovered", payload__outcome="retry").count() == 1
        assert_gap_free(done.session_id)
    # The model saw each call twice: the one that died with the gateway (it answered into the void
    # after its sleep), and the one re-issued. Never three times.
    wait_for(lambda: len(_requests_of(scripted_model, token)) >= 40, 20, "the killed calls to be answered")
    per_turn = [sum(1 for e in _requests_of(scripted_model, token) if e.last_user_message.endswith(f" {n}"))
                for n in range(20)]
    assert per_turn == [2] * 20


RETRY_AFTER = 5


def test_gateway_honours_retry_after_for_that_endpoint_only(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer, workers: None) -> None:
    other, other_url = start_in_thread(port=0)
    try:
        slow_agent = factories.agent_profile(base_url=other_url, model="scripted")
        slow_agent.tools.set(engine_agent.tools.all())
        token = uuid.uuid4().hex
        _, limited = session_start(agent=engine_agent, owner=owner,
                                   input=script(f"error 429 {RETRY_AFTER}", f"say ok {token}"))
        assert limited is not None
        refused = wait_for(lambda: [e for e in _requests_of(scripted_model, token) if e.status == 429], 30,
                           "the 429")[0]
        # Meanwhile a session on another endpoint is served before the first endpoint's Retry-After
        # ends (5 s: starting that session took > 2 s beside two other pytest workers).
        _, free = session_start(agent=slow_agent, owner=owner, input=f"say free {token}")
        assert free is not None
        assert finished(free).status == "completed"
        (served,) = [e for e in other.logged_requests() if token in e.last_user_message]
        assert served.finished_at < refused.finished_at + RETRY_AFTER
        limited = finished(limited)
        assert limited.status == "completed" and limited.output_text == f"ok {token}"
        retried = [e for e in _requests_of(scripted_model, token) if e.status == 200]
        assert len(retried) == 1 and retried[0].received_at >= refused.finished_at + RETRY_AFTER - 0.05
        retrying = Event.objects.get(session_id=limited.session_id, type="model.retrying")
        assert retrying.payload["retry_after"] == float(RETRY_AFTER)
    finally:
        other.shutdown()
        other.server_close()


def _most_at_once(entries: list[RequestLogEntry]) -> int:
    """The most requests that were being answered at the same moment."""
    edges = sorted([(e.received_at, 1) for e in entries] + [(e.finished_at, -1) for e in entries])
    most = current = 0
    for _, change in edges:
        current += change
        most = max(most, current)
    return most


def test_gateway_calls_overlap_beyond_the_celery_pool(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer, workers: None) -> None:
    """Twelve sessions whose calls take a second each: the gateway has them all in flight at once
    (the test's Celery worker has 4 threads, which is what model calls were capped at before)."""
    token = uuid.uuid4().hex
    turns = [session_start(agent=engine_agent, owner=owner,
                           input=script("sleep 1000", tool("list_files", path="."), "sleep 1000",
                                        f"say {token} {n}"))[1] for n in range(12)]
    for turn in turns:
        assert turn is not None and finished(turn).status == "completed"
    first_calls = [e for e in _requests_of(scripted_model, token) if e.position == 0]
    assert len(first_calls) == 12 and _most_at_once(first_calls) == 12


def test_gateway_stream_survives_redis_errors_on_xadd(engine_agent: AgentProfile, owner: User,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis that refuses the hand-off leaves the committed turn to the sweeper, never a 500."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise redis.ConnectionError("down")

    monkeypatch.setattr(redis.Redis, "xadd", refuse)
    step = _planned_model_step(engine_agent, owner, "say later")
    assert Step.objects.get(pk=step.pk).status == "planned"


@pytest.mark.gateway_watch(0.5)
def test_gateway_lets_go_of_the_call_of_a_cancelled_turn(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer, model_gateway: Any) -> None:
    """Cancelling a turn frees its model call at once: nothing is recorded for it, and neither a
    connection to the endpoint nor a gateway slot waits out a reply nobody would read."""
    token = uuid.uuid4().hex
    _, turn = session_start(agent=engine_agent, owner=owner, input=script("sleep 60000", f"say late {token}"))
    assert turn is not None
    wait_for(lambda: model_gateway.in_flight == 1 and model_gateway.calls, 30, "the call held by the gateway")
    turn_cancel(turn_id=turn.id)
    # Well before the model's 60 s reply (the gateway looks every 0.5 s here).
    wait_for(lambda: model_gateway.in_flight == 0, 15, "the gateway to let go of the call")
    assert not model_gateway.calls and not model_gateway.held
    turn.refresh_from_db()
    assert turn.status == "cancelled"
    step = Step.objects.get(turn=turn, kind="model")
    assert step.status == "cancelled" and step.attempts == 1
    assert not Event.objects.filter(session_id=turn.session_id, type="model.completed").exists()
    assert_gap_free(turn.session_id)


def test_gateway_leaves_one_pooled_connection_for_its_announcer(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.conf import settings

    from sessions_app.engine.gateway import Gateway

    options = {**settings.DATABASES["default"].get("OPTIONS", {}), "pool": {"min_size": 1, "max_size": 8}}
    monkeypatch.setitem(settings.DATABASES["default"], "OPTIONS", options)
    assert Gateway(db_threads=8)._executor.size == 7  # type: ignore[union-attr]
    assert Gateway(db_threads=12)._executor.size == 7  # type: ignore[union-attr]
    assert Gateway(db_threads=4)._executor.size == 4  # type: ignore[union-attr]
    monkeypatch.setitem(settings.DATABASES["default"], "OPTIONS", {})  # no pool (SQLite): as asked
    assert Gateway(db_threads=8)._executor.size == 8  # type: ignore[union-attr]


def _long_turn_driven(agent: AgentProfile, owner: User, token: str, *, concurrency: int) -> Turn:
    """A turn of three model calls with a read-only tool after each of the first two, driven by a
    gateway of ``concurrency`` slots until it ends; the turn as stored."""
    gateway, thread = run_in_thread(concurrency=concurrency, db_threads=2)
    try:
        _, turn = session_start(agent=agent, owner=owner, input=script(
            tool("list_files", path="."), tool("list_files", path="."), f"say long {token}"))
        assert turn is not None
        return finished(turn, timeout=30)
    finally:
        gateway.stop_threadsafe()
        thread.join(30)


def _hand_overs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each turn handed by the gateway to a Celery tick (the engine's ``dispatch.tick_enqueue``,
    still called through); the gateway's share of a turn (``INLINE_SECONDS``) used at once."""
    from agentops import dispatch
    from sessions_app.engine import gateway

    sent: list[str] = []
    enqueue = dispatch.tick_enqueue

    def counted(turn_id: uuid.UUID | str) -> None:
        sent.append(str(turn_id))
        enqueue(turn_id)

    monkeypatch.setattr(dispatch, "tick_enqueue", counted)
    monkeypatch.setattr(gateway, "INLINE_SECONDS", 0.0)
    return sent


def test_a_gateway_with_free_slots_drives_a_turn_past_its_share_to_the_end(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A coroutine costs nothing while the model thinks: a gateway that has room drives a long
    turn to its end. Handing it to Celery every 30 s of every turn (as a Celery task must) cost a
    tick, a stream entry and the conversation loaded again, and on a busy machine (turns longer
    than 30 s) that extra work slowed every turn further (bench/concurrency.py N = 1,000: 4.3-5.6x
    the ideal before, 3.2x after). No Celery worker here: a hand-over would leave the turn waiting."""
    token = uuid.uuid4().hex
    handed = _hand_overs(monkeypatch)
    turn = _long_turn_driven(engine_agent, owner, token, concurrency=10)
    assert turn.status == "completed" and turn.output_text == f"long {token}", turn.error_message
    assert handed == []
    assert len(_requests_of(scripted_model, token)) == 3
    assert_gap_free(turn.session_id)


def test_a_full_gateway_hands_a_turn_back_after_its_share(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer, celery_worker: object,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With every slot taken, a turn past its share goes back to Celery and the stream at its next
    step, so that turns waiting for a slot get one; it still completes, each call made once."""
    token = uuid.uuid4().hex
    handed = _hand_overs(monkeypatch)
    turn = _long_turn_driven(engine_agent, owner, token, concurrency=1)
    assert turn.status == "completed" and turn.output_text == f"long {token}", turn.error_message
    assert handed and set(handed) == {str(turn.id)}
    assert len(_requests_of(scripted_model, token)) == 3
    assert Step.objects.filter(turn=turn, kind="tool", status="completed").count() == 2
    assert_gap_free(turn.session_id)


def test_a_stopping_gateway_hands_its_turns_back_at_the_next_step(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer, celery_worker: object) -> None:
    """A gateway told to stop finishes the call in flight, records it, and hands the turn on (the
    next model call goes to the stream, for another gateway) instead of driving it to the end."""
    token = uuid.uuid4().hex
    first, first_thread = run_in_thread(concurrency=10, db_threads=2)
    second = second_thread = None
    try:
        _, turn = session_start(agent=engine_agent, owner=owner, input=script(
            "sleep 1500", tool("list_files", path="."), f"say carried on {token}"))
        assert turn is not None
        wait_for(lambda: first.calls or None, 20, "the first call in flight")
        first.stop_threadsafe()
        first_thread.join(30)
        assert not first_thread.is_alive()
        assert len(_requests_of(scripted_model, token)) == 1  # the second call was not made by it
        second, second_thread = run_in_thread(concurrency=10, db_threads=2)
        done = finished(turn, timeout=30)
    finally:
        if first_thread.is_alive():
            first.stop_threadsafe()
            first_thread.join(30)
        if second is not None and second_thread is not None:
            second.stop_threadsafe()
            second_thread.join(30)
    assert done.status == "completed" and done.output_text == f"carried on {token}", done.error_message
    assert len(_requests_of(scripted_model, token)) == 2
    assert Step.objects.get(turn=turn, kind="model", index=0).attempts == 1
    assert_gap_free(turn.session_id)


def test_a_busy_gateway_takes_its_share_of_the_unread_entries() -> None:
    """A busy gateway's read of what nobody has read takes the unread entries over the gateways
    reading the stream, so that a burst is split between busy gateways (it went to whichever
    looked first: 197 of one gateway's 208 turns at N = 300, bench/concurrency.py)."""
    from django.conf import settings

    from sessions_app.engine.gateway import Gateway

    async def shares() -> tuple[int, int, int, int]:
        client = aioredis.from_url(settings.REDIS_URL)
        try:
            await client.xgroup_create(MODEL_STREAM, MODEL_GROUP, id="0", mkstream=True)
            for n in range(30):
                await client.xadd(MODEL_STREAM, {"step_id": str(n)})
            await client.xreadgroup(MODEL_GROUP, "gateway-a", {MODEL_STREAM: ">"}, count=4)
            await client.xreadgroup(MODEL_GROUP, "gateway-b", {MODEL_STREAM: ">"}, count=2)
            ((done, _),) = await client.xrange(MODEL_STREAM, count=1)  # a's first, done: acknowledged and deleted
            await client.xack(MODEL_STREAM, MODEL_GROUP, done)
            await client.xdel(MODEL_STREAM, done)
            gateway = Gateway(concurrency=100, db_threads=2)
            # 24 unread, 2 gateways reading: 12 each; never more than asked; 1 when none is unread.
            share, capped = await gateway._share(client, 100), await gateway._share(client, 5)
            await client.xreadgroup(MODEL_GROUP, "gateway-a", {MODEL_STREAM: ">"}, count=100)
            drained = await gateway._share(client, 100)
            await client.delete(MODEL_STREAM)
            broken = await gateway._share(client, 7)  # no group: what it was asked for
            return share, capped, drained, broken
        finally:
            await client.aclose()

    assert asyncio.run(shares()) == (12, 5, 1, 7)


def test_a_gateway_takes_new_turns_up_to_its_share_of_the_gateways_load() -> None:
    """Each gateway says how many turns it drives before it reads (``LOAD_KEY``); one that drives
    more than the mean plus ``BALANCE_SLACK`` leaves new turns to the others (a run split 59/41
    before, the busier one finishing alone). A load not said for three heartbeats is a gateway gone."""
    from django.conf import settings

    from sessions_app.engine.gateway import BALANCE_SLACK, LOAD_FRESH_SECONDS, LOAD_KEY, READ_BATCH, Gateway

    async def room(in_flight: int, others: dict[str, str]) -> int:
        client = aioredis.from_url(settings.REDIS_URL)
        try:
            await client.delete(LOAD_KEY)
            if others:
                await client.hset(LOAD_KEY, mapping=others)
            gateway = Gateway(name="me", db_threads=1)
            gateway.in_flight = in_flight
            return await gateway._room(client)
        finally:
            await client.delete(LOAD_KEY)
            await client.aclose()

    now = time.time()
    assert asyncio.run(room(20, {})) == READ_BATCH  # alone
    assert asyncio.run(room(20, {"other": f"0 {now:.3f}"})) == 0  # mean 10: 20 > 10 + slack
    assert asyncio.run(room(0, {"other": f"20 {now:.3f}"})) == 10 + BALANCE_SLACK
    assert asyncio.run(room(12, {"b": f"12 {now:.3f}", "c": f"12 {now:.3f}"})) == BALANCE_SLACK
    # A gateway starved of CPU in a burst says its load late: 5 s ago it still counts (at 3 s, the
    # first of two gateways to wake took the whole burst).
    assert asyncio.run(room(20, {"other": f"0 {now - 5:.3f}"})) == 0
    gone = f"0 {now - LOAD_FRESH_SECONDS - 1:.3f}"
    assert asyncio.run(room(20, {"other": gone})) == READ_BATCH
