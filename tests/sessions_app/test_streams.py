"""One stream algorithm for SSE and the WebSocket: backlog in pages, live events once, gaps re-read."""

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from typing import Any
from uuid import UUID

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth.models import User
from django.db import transaction
from django.test import AsyncClient
from django.utils import timezone

from sessions_app import streams
from sessions_app.announce import session_group
from sessions_app.events import event_record
from sessions_app.models import AgentSession, Event
from sessions_app.streams import EventFeed, Message
from tests import factories
from tests.helpers import api_token, full_or_short

# --- EventFeed, against an in-memory log ------------------------------------------------------------------------


def _log(last: int) -> Callable[[int, int | None, int], Any]:
    """A reader of a log holding seq 1..last (as the database would return them)."""

    async def read(after: int, until: int | None, limit: int) -> list[Message]:
        top = last if until is None else min(until, last)
        return [{"event": {"seq": seq}} for seq in range(after + 1, top + 1)][:limit]

    return read


async def _all(items: AsyncIterator[Message]) -> list[int]:
    return [streams.seq_of(m) async for m in items]


async def test_event_feed_backlog_reads_page_after_page_until_caught_up() -> None:
    feed = EventFeed(_log(10), after=2, page=3)
    assert await _all(feed.backlog()) == list(range(3, 11))
    assert feed.last == 10


async def test_event_feed_live_drops_what_the_backlog_sent() -> None:
    feed = EventFeed(_log(5), after=0, page=3)
    await _all(feed.backlog())
    assert await _all(feed.live({"event": {"seq": 4}})) == []  # stored during the backlog read, announced after
    assert await _all(feed.live({"event": {"seq": 6}})) == [6]
    assert await _all(feed.live({"event": {"seq": 6}})) == []  # the channel layer delivered it twice


async def test_event_feed_live_reads_a_gap_from_the_log_first() -> None:
    feed = EventFeed(_log(1000), after=0, page=7)
    assert await _all(feed.live({"event": {"seq": 1}})) == [1]
    assert await _all(feed.live({"event": {"seq": 999}})) == list(range(2, 1000))  # dropped by the layer
    assert feed.last == 999


async def test_event_feed_replay_resends_a_range_without_moving_back() -> None:
    feed = EventFeed(_log(9), after=9, page=2)
    assert await _all(feed.replay(3, 7)) == [4, 5, 6, 7]
    assert feed.last == 9


# --- the SSE stream, against the database and the channel layer --------------------------------------------------

IDS = re.compile(r"^id: (\d+)$", re.MULTILINE)


def _lose_event(session_id: UUID) -> int:
    """Store an event the channel layer never announces (as when it drops one); returns its seq."""
    with transaction.atomic():
        row = AgentSession.objects.select_for_update().get(pk=session_id)
        Event.objects.create(session=row, seq=row.last_seq + 1, type="note.lost", payload={})
        AgentSession.objects.filter(pk=row.pk).update(last_seq=row.last_seq + 1)
    return row.last_seq + 1


def _read_stream(session_id: UUID, *, until_seq: int, on_seq: dict[int, Callable[[], Any]],
                 read: streams.Reader | None = None) -> list[int]:
    """The seqs the stream sends, up to ``until_seq``; ``on_seq[n]()`` runs (in the test's thread) once
    seq n is out."""

    async def run() -> list[int]:
        # Generous hang guards, not a speed target: under three xdist workers on two cores the
        # 25,000-event reads (make test FULL=1) took > 20 s; what the tests assert is each seq once, in order.
        stream = streams.event_stream(session_id, 0, max_seconds=150, read=read)
        seqs: list[int] = []
        try:
            async with asyncio.timeout(120):
                async for frame in stream:
                    for seq in map(int, IDS.findall(frame)):
                        seqs.append(seq)
                        if seq in on_seq:
                            await sync_to_async(on_seq[seq])()
                    if until_seq in seqs:
                        break
        finally:
            await stream.aclose()
        return seqs

    return async_to_sync(run)()


@pytest.mark.django_db(transaction=True)
def test_event_stream_sends_an_event_in_both_backlog_and_live_once() -> None:
    session = factories.session()
    for n in range(2):
        event_record(session_id=session.id, type="custom.tick", payload={"n": n})  # seq 2, 3
    stored = streams.stored_events(session.id)
    overlap: dict[str, Any] = {}

    async def read_while_an_event_commits(after: int, until: int | None, limit: int) -> list[Message]:
        if not overlap:  # committed after the stream joined the group, before the backlog is read
            event = await sync_to_async(event_record)(session_id=session.id, type="custom.overlap")
            overlap["event"] = event.as_dict()
        return await stored(after, until, limit)

    def announce_the_overlap_again_then_record_five() -> None:
        # The announcer sends seq 4 too; send it once more, so the live copy is certain to arrive before 5.
        async_to_sync(get_channel_layer().group_send)(session_group(session.id),
                                                     {"type": "event.message", "event": overlap["event"]})
        event_record(session_id=session.id, type="custom.after")

    seqs = _read_stream(session.id, until_seq=5, on_seq={4: announce_the_overlap_again_then_record_five},
                        read=read_while_an_event_commits)
    assert overlap["event"]["seq"] == 4
    assert seqs == [1, 2, 3, 4, 5]


@pytest.mark.django_db(transaction=True)
def test_event_stream_sends_each_event_of_an_announced_batch_once() -> None:
    session = factories.session()
    event_record(session_id=session.id, type="custom.tick")  # seq 2

    def announce_three_and_four_in_one_batch() -> None:
        assert [_lose_event(session.id) for _ in range(2)] == [3, 4]
        items = [{"event": e.as_dict(), "html": ""} for e in Event.objects.filter(session_id=session.id, seq__gte=2)
                 .order_by("seq")]  # seq 2 again (already sent: dropped), then 3 and 4
        async_to_sync(get_channel_layer().group_send)(session_group(session.id), {"type": "event.batch",
                                                                                  "items": items})
        event_record(session_id=session.id, type="custom.after")  # seq 5

    stored = streams.stored_events(session.id)
    reads: list[tuple[int, int | None]] = []

    async def counted(after: int, until: int | None, limit: int) -> list[Message]:
        reads.append((after, until))
        return await stored(after, until, limit)

    seqs = _read_stream(session.id, until_seq=5, on_seq={2: announce_three_and_four_in_one_batch}, read=counted)
    assert seqs == [1, 2, 3, 4, 5]
    assert reads == [(0, None)]  # the backlog only: 3 and 4 came live, from the batch (no gap to re-read)


@pytest.mark.django_db(transaction=True)
def test_event_stream_reads_an_event_the_channel_layer_lost_from_the_database() -> None:
    session = factories.session()
    event_record(session_id=session.id, type="custom.tick")  # seq 2

    def lose_three_then_record_four() -> None:
        assert _lose_event(session.id) == 3
        event_record(session_id=session.id, type="custom.after_the_gap")  # announced live as seq 4

    assert _read_stream(session.id, until_seq=4, on_seq={2: lose_three_then_record_four}) == [1, 2, 3, 4]


# A backlog or gap of many pages (PAGE = 500): 25,000 events under `make test FULL=1`, 5,000 (10 pages)
# in CI. Either fails when the stream reads one page.
MANY = full_or_short(25_000, 5_000)


@pytest.mark.django_db(transaction=True)  # the stream reads in worker threads: the rows must be committed
def test_events_stream_api_sends_many_pages_of_events_each_once_in_order(operator: User) -> None:
    session = factories.session(owner=operator)  # seq 1
    total = MANY
    now = timezone.now()
    Event.objects.bulk_create([Event(session=session, seq=seq, type="custom.bulk", payload={"n": seq}, created_at=now)
                               for seq in range(2, total + 1)], batch_size=5000)
    AgentSession.objects.filter(pk=session.pk).update(last_seq=total)
    token = api_token(operator)

    async def read() -> str:
        response = await AsyncClient().get(f"/api/sessions/{session.id}/events/stream?after=0&max_seconds=0.2",
                                           headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200
        return b"".join([chunk async for chunk in response.streaming_content]).decode()  # type: ignore[attr-defined]

    seqs = [int(seq) for seq in IDS.findall(async_to_sync(read)())]
    assert len(seqs) == total
    assert seqs == list(range(1, total + 1))


def _bulk_unannounced(session_id: UUID, count: int) -> int:
    """Store ``count`` events the channel layer never announces (a long outage); returns the last seq."""
    with transaction.atomic():
        row = AgentSession.objects.select_for_update().get(pk=session_id)
        now = timezone.now()
        Event.objects.bulk_create([Event(session=row, seq=seq, type="custom.bulk", payload={"n": seq}, created_at=now)
                                   for seq in range(row.last_seq + 1, row.last_seq + count + 1)], batch_size=5000)
        AgentSession.objects.filter(pk=row.pk).update(last_seq=row.last_seq + count)
    return row.last_seq + count


@pytest.mark.django_db(transaction=True)
def test_event_stream_rereads_a_gap_of_many_pages_of_events_each_once_in_order() -> None:
    session = factories.session()  # seq 1
    total = MANY

    def lose_many_then_record_one() -> None:
        assert _bulk_unannounced(session.id, total) == total + 1
        event_record(session_id=session.id, type="custom.after_the_gap")  # announced live

    seqs = _read_stream(session.id, until_seq=total + 2, on_seq={1: lose_many_then_record_one})
    assert len(seqs) == total + 2
    assert seqs == list(range(1, total + 3))
