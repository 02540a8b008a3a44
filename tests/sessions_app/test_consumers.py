"""ws/sessions/<id>/: authentication, backlog by seq, live forwarding without database reads, resend."""

import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import transaction

from sessions_app import services
from sessions_app.models import AgentSession, Event
from tests import factories
from tests.helpers import full_or_short
from tests.helpers import ws_communicator as communicator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("close_thread_connections")]


@database_sync_to_async
def make_session() -> tuple[User, AgentSession]:
    owner = factories.user(groups=["operators"])
    session = factories.session(owner=owner, title="live")
    services.turn_create(session_id=session.id, input="go")
    return owner, session


@database_sync_to_async
def record(session: AgentSession, text: str) -> int:
    return services.event_record(session_id=session.id, type="note.added", payload={"text": text}).seq


@database_sync_to_async
def lose(session: AgentSession) -> int:
    """Store an event the channel layer never announces (as when it drops one); returns its seq."""
    with transaction.atomic():
        row = AgentSession.objects.select_for_update().get(pk=session.id)
        Event.objects.create(session=row, seq=row.last_seq + 1, type="note.lost", payload={})
        AgentSession.objects.filter(pk=row.pk).update(last_seq=row.last_seq + 1)
    return row.last_seq + 1


async def receive_events(comm: WebsocketCommunicator, count: int) -> list[dict[str, Any]]:
    return [await comm.receive_json_from(timeout=5) for _ in range(count)]


async def assert_next_is(comm: WebsocketCommunicator, session: AgentSession, marker: str) -> None:
    """Record an event and check it is the next message: nothing else was sent before it."""
    seq = await record(session, marker)
    message = await comm.receive_json_from(timeout=5)
    assert (message["event"]["seq"], message["event"]["payload"]) == (seq, {"text": marker})


async def test_anonymous_is_refused() -> None:
    _owner, session = await make_session()
    comm = await communicator(f"/ws/sessions/{session.id}/", None)
    connected, code = await comm.connect()
    assert not connected and code == 4401
    await comm.disconnect()


async def test_user_without_permission_is_refused() -> None:
    _owner, session = await make_session()
    nobody = await database_sync_to_async(factories.user)("nobody")
    comm = await communicator(f"/ws/sessions/{session.id}/", nobody)
    connected, code = await comm.connect()
    assert not connected and code == 4403
    await comm.disconnect()


async def test_unknown_session_is_refused() -> None:
    owner, _session = await make_session()
    comm = await communicator("/ws/sessions/00000000-0000-0000-0000-000000000000/", owner)
    connected, code = await comm.connect()
    assert not connected and code == 4403
    await comm.disconnect()


async def test_backlog_after_last_seq_then_live_events_once_in_order() -> None:
    owner, session = await make_session()
    # session.created, session.status_changed, turn.queued = seq 1..3
    comm = await communicator(f"/ws/sessions/{session.id}/", owner)
    connected, _ = await comm.connect()
    assert connected
    await comm.send_json_to({"type": "hello", "last_seq": 1})
    backlog = await receive_events(comm, 2)
    assert [m["event"]["seq"] for m in backlog] == [2, 3]
    assert backlog[1]["event"]["type"] == "turn.queued"
    assert 'data-target="#timeline"' in backlog[1]["html"]
    assert await record(session, "live one") == 4
    live = await comm.receive_json_from(timeout=5)
    assert live["event"]["seq"] == 4 and live["event"]["payload"] == {"text": "live one"}
    await assert_next_is(comm, session, "nothing in between")
    await comm.disconnect()


async def test_live_messages_are_forwarded_without_reading_the_database() -> None:
    owner, session = await make_session()
    comm = await communicator(f"/ws/sessions/{session.id}/", owner)
    await comm.connect()
    await comm.send_json_to({"type": "hello", "last_seq": 3})
    # Seq 4 exists nowhere in the database: the consumer forwards the sender's event and html as is.
    message: dict[str, Any] = {"type": "event.message", "html": "<template data-op=x></template>",
               "event": {"seq": 4, "type": "tool.started", "session_id": str(session.id), "payload": {}}}
    await get_channel_layer().group_send(f"session.{session.id}", message)
    forwarded = await comm.receive_json_from(timeout=5)
    assert forwarded == {"type": "event", "event": message["event"], "html": message["html"]}
    # A duplicate (the channel layer or the backlog already delivered it) is dropped.
    await get_channel_layer().group_send(f"session.{session.id}", message)
    marker = {**message, "event": {**message["event"], "seq": 5}}
    await get_channel_layer().group_send(f"session.{session.id}", marker)
    assert (await comm.receive_json_from(timeout=5))["event"]["seq"] == 5
    await comm.disconnect()


async def test_a_batch_of_live_events_is_forwarded_one_by_one_in_order_without_duplicates() -> None:
    owner, session = await make_session()
    comm = await communicator(f"/ws/sessions/{session.id}/", owner)
    await comm.connect()
    await comm.send_json_to({"type": "hello", "last_seq": 3})
    # One announcement carrying seq 3 (already sent: dropped), 4 and 5 (neither in the database).
    items: list[dict[str, Any]] = [{"html": f"<template data-op=n{seq}></template>",
                                    "event": {"seq": seq, "type": "tool.progress", "session_id": str(session.id),
                                              "payload": {}}}
                                   for seq in (3, 4, 5)]
    await get_channel_layer().group_send(f"session.{session.id}", {"type": "event.batch", "items": items})
    got = await receive_events(comm, 2)
    assert got == [{"type": "event", **item} for item in items[1:]]
    after = {**items[2], "event": {**items[2]["event"], "seq": 6}, "announced_at": 1.5}
    await get_channel_layer().group_send(f"session.{session.id}", {"type": "event.message", **after})
    # Nothing else came between; the sender's announcement time goes along.
    assert await comm.receive_json_from(timeout=5) == {"type": "event", **after}
    await comm.disconnect()


async def test_a_timed_announcement_gets_the_time_the_consumer_took_it() -> None:
    """AGENTOPS_PUSH_TIMINGS: an announcement with the sender's stages gets this process's own
    stage (when its consumer took it from the layer), between the sender's time and now."""
    owner, session = await make_session()
    comm = await communicator(f"/ws/sessions/{session.id}/", owner)
    await comm.connect()
    await comm.send_json_to({"type": "hello", "last_seq": 3})
    event = {"seq": 4, "type": "tool.progress", "session_id": str(session.id), "payload": {}}
    sent = time.time()
    await get_channel_layer().group_send(f"session.{session.id}", {
        "type": "event.message", "event": event, "html": "", "announced_at": sent, "stages": [1.0, 2.0, 3.0, 4.0]})
    timed = await comm.receive_json_from(timeout=5)
    assert timed["stages"] == [1.0, 2.0, 3.0, 4.0] and timed["announced_at"] == sent
    assert sent <= timed["forwarded_at"] <= time.time()
    # Without the sender's stages (timings off) there is no stage of its own either.
    await get_channel_layer().group_send(f"session.{session.id}", {
        "type": "event.message", "event": {**event, "seq": 5}, "html": "", "announced_at": sent})
    assert "forwarded_at" not in await comm.receive_json_from(timeout=5)
    await comm.disconnect()


async def test_a_live_event_after_a_gap_brings_the_missing_ones_from_the_database() -> None:
    owner, session = await make_session()
    comm = await communicator(f"/ws/sessions/{session.id}/", owner)
    await comm.connect()
    await comm.send_json_to({"type": "hello", "last_seq": 2})
    assert (await comm.receive_json_from(timeout=5))["event"]["seq"] == 3  # the backlog has been read
    assert await lose(session) == 4
    assert await lose(session) == 5
    assert await record(session, "after the gap") == 6
    got = await receive_events(comm, 3)
    assert [(m["event"]["seq"], m["event"]["type"]) for m in got] == [(4, "note.lost"), (5, "note.lost"),
                                                                      (6, "note.added")]
    await assert_next_is(comm, session, "nothing twice")
    await comm.disconnect()


async def test_client_asks_for_a_missing_range() -> None:
    owner, session = await make_session()
    for i in range(5):
        await record(session, f"n{i}")  # seq 4..8
    comm = await communicator(f"/ws/sessions/{session.id}/", owner)
    await comm.connect()
    await comm.send_json_to({"type": "hello", "last_seq": 8})
    await comm.send_json_to({"type": "resend", "after": 4, "until": 6})
    resent = await receive_events(comm, 2)
    assert [m["event"]["seq"] for m in resent] == [5, 6]
    await assert_next_is(comm, session, "only what was asked")
    await comm.disconnect()


async def test_reconnect_gets_every_missed_event_once() -> None:
    owner, session = await make_session()
    comm = await communicator(f"/ws/sessions/{session.id}/", owner)
    await comm.connect()
    await comm.send_json_to({"type": "hello", "last_seq": 3})
    await comm.disconnect()
    for i in range(250):  # more than one backlog batch
        await record(session, f"missed {i}")
    comm = await communicator(f"/ws/sessions/{session.id}/", owner)
    await comm.connect()
    await comm.send_json_to({"type": "hello", "last_seq": 3})
    seqs = [m["event"]["seq"] for m in await receive_events(comm, 250)]
    assert seqs == list(range(4, 254))
    await assert_next_is(comm, session, "after the backlog")
    await comm.disconnect()


MANY = full_or_short(25_000, 2_500)


@database_sync_to_async
def bulk(session: AgentSession, count: int) -> int:
    """Store ``count`` events at once, none announced; returns the last seq."""
    from django.utils import timezone

    with transaction.atomic():
        row = AgentSession.objects.select_for_update().get(pk=session.id)
        now = timezone.now()
        Event.objects.bulk_create([Event(session=row, seq=seq, type="custom.bulk", payload={"n": seq}, created_at=now)
                                   for seq in range(row.last_seq + 1, row.last_seq + count + 1)], batch_size=5000)
        AgentSession.objects.filter(pk=row.pk).update(last_seq=row.last_seq + count)
    return row.last_seq + count


async def test_backlog_and_gap_of_many_pages_of_events_each_once_in_order() -> None:
    """The same algorithm as the SSE stream: a backlog and a gap of any length, read page by page.
    25,000 events each under ``make test FULL=1``; 2,500 (12.5 pages of BACKLOG_BATCH) in CI: both
    fail when the feed reads one page."""
    owner, session = await make_session()
    first = await bulk(session, MANY)
    comm = await communicator(f"/ws/sessions/{session.id}/", owner)
    await comm.connect()
    await comm.send_json_to({"type": "hello", "last_seq": 0})
    seqs = [m["event"]["seq"] for m in await receive_events(comm, first)]
    assert seqs == list(range(1, first + 1))
    last = await bulk(session, MANY)  # lost by the channel layer: the next live event shows the gap
    seq = await record(session, "after the gap")
    seqs = [m["event"]["seq"] for m in await receive_events(comm, seq - first)]
    assert seqs == list(range(first + 1, seq + 1)) and seq == last + 1
    await comm.disconnect()
