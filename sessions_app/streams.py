"""A session's events in seq order, each exactly once, for a client that says which seq it has.

One algorithm for the SSE stream (``api.events_stream_api``) and the WebSocket consumer
(``consumers.SessionConsumer``):

1. join the session's channel-layer group first, so nothing committed from then on slips by;
2. send the backlog from the database: every event after the client's seq, page by page until
   a short page (a session may hold any number of events: never cap and jump ahead);
3. then forward live events from the group, dropping any with ``seq <= last`` (already sent,
   typically by the backlog: an event committed while it was read is in both) and, when one
   arrives after a gap (the channel layer is at-most-once and drops messages for a slow
   reader), re-reading the missing range from the database before it.

The database is read on connect and on a gap only, never per live message (DESIGN.md, "Live
progress").
"""

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from channels.layers import get_channel_layer

from agentops.asyncdb import database_read
from agentops.channel_layer import REJOINED
from agentops.streamaccess import spread
from sessions_app import selectors
from sessions_app.announce import session_group, unbatch

PAGE = 500
HEARTBEAT_SECONDS = 15.0

# A message is ``{"event": Event.as_dict(), ...}`` (the consumer's also carry ``"html"``).
Message = dict[str, Any]
# read(after, until, limit): stored messages with after < seq <= until (no bound when None), in order.
Reader = Callable[[int, int | None, int], Awaitable[list[Message]]]


def seq_of(message: Message) -> int:
    return int(message["event"]["seq"])


class EventFeed:
    """Where one client is in a session's event log, and what to send it next."""

    def __init__(self, read: Reader, *, after: int, page: int = PAGE) -> None:
        self.read = read
        self.last = max(0, after)  # the highest seq the client has been sent
        self.page = page

    async def backlog(self) -> AsyncIterator[Message]:
        """Everything stored after ``last``."""
        async for message in self._range(self.last, None):
            yield message

    async def live(self, message: Message) -> AsyncIterator[Message]:
        """What to send for a live message: nothing for a duplicate; the missing range from the
        database, then the message, after a gap."""
        seq = seq_of(message)
        if seq <= self.last:
            return
        if seq > self.last + 1:
            async for missing in self._range(self.last, seq - 1):
                yield missing
        self.last = seq
        yield message

    async def replay(self, after: int, until: int) -> AsyncIterator[Message]:
        """A range the client asks for again, sent even where it was sent before."""
        async for message in self._range(after, until):
            yield message

    async def _range(self, after: int, until: int | None) -> AsyncIterator[Message]:
        while True:
            batch = await self.read(after, until, self.page)
            for message in batch:
                after = seq_of(message)
                self.last = max(self.last, after)
                yield message
            if len(batch) < self.page:
                return


def stored_events(session_id: UUID | str) -> Reader:
    """A reader of the session's stored events, as messages without fragments (the API's)."""

    def load(after: int, until: int | None, limit: int) -> list[Message]:
        return [{"event": e.as_dict()}
                for e in selectors.events_after(session_id=session_id, after=after, until=until, limit=limit)]

    return database_read(load, serving=True)


def control_frame(name: str, data: dict[str, Any]) -> str:
    """A frame about the stream itself (no ``id:``: it must not move the client's Last-Event-ID)."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def sse_frame(event: dict[str, Any]) -> str:
    return f"id: {event['seq']}\nevent: {event['type']}\ndata: {json.dumps(event, default=str)}\n\n"


Recheck = Callable[[], Awaitable[bool]]


@dataclass(frozen=True)
class StreamEnd:
    """The last item of ``session_events`` when the stream itself ends it (not a session's
    event): ``access_revoked`` or ``reconnect`` (max life reached; ``last_seq`` to resume from)."""
    reason: str
    last_seq: int


async def session_events(session_id: UUID, after: int, *, max_seconds: float | None = None,
                         read: Reader | None = None, recheck: Recheck | None = None,
                         recheck_seconds: float = 30.0, max_life_seconds: float | None = None
                         ) -> AsyncGenerator[dict[str, Any] | StreamEnd | None, None]:
    """The session's events after ``after`` (``Event.as_dict()``), then live ones, each once and in
    seq order; ``None`` first (the subscription is in place) and every HEARTBEAT_SECONDS without an
    event; ends after ``max_seconds`` when given.

    Every ``recheck_seconds`` (the first time at random within the first interval) ``recheck()``
    says whether the client may still watch (its token or session, its team): when not, a
    ``StreamEnd("access_revoked")`` ends it. After ``max_life_seconds`` (at most; at random within
    its last tenth) a ``StreamEnd("reconnect")`` ends it: the client reconnects from the last
    seq, and so authenticates again (``agentops/streamaccess.py``)."""
    layer = get_channel_layer()
    group = session_group(session_id)
    channel = await layer.new_channel() if layer is not None else ""
    if layer is not None:
        await layer.group_add(group, channel)  # before the backlog: nothing slips between the two
    feed = EventFeed(read or stored_events(session_id), after=after)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_seconds if max_seconds else None
    end_of_life = loop.time() + spread(max_life_seconds, shortest=0.9) if max_life_seconds else None
    next_check = loop.time() + spread(recheck_seconds)  # streams that connected together check apart
    try:
        yield None
        async for message in feed.backlog():
            yield message["event"]
        while deadline is None or loop.time() < deadline:
            now = loop.time()
            if recheck is not None and now >= next_check:
                if not await recheck():
                    yield StreamEnd("access_revoked", feed.last)
                    return
                next_check = now + recheck_seconds
            if end_of_life is not None and now >= end_of_life:
                yield StreamEnd("reconnect", feed.last)
                return
            bounds = [HEARTBEAT_SECONDS] + [t - now for t in (deadline, end_of_life) if t is not None]
            if recheck is not None:
                bounds.append(next_check - now)
            timeout = min(bounds)
            try:
                if layer is None:
                    await asyncio.sleep(max(0.01, timeout))
                    raise TimeoutError
                received = await asyncio.wait_for(layer.receive(channel), timeout=max(0.01, timeout))
            except TimeoutError:
                yield None
                continue
            if received.get("type") == REJOINED:  # Redis lost the groups: read what reached nobody
                async for message in feed.backlog():
                    yield message["event"]
                continue
            for item in unbatch(received):  # an announcement may carry several events
                async for message in feed.live(item):
                    yield message["event"]
    finally:
        if layer is not None:
            await layer.group_discard(group, channel)


async def event_stream(session_id: UUID, after: int, *, max_seconds: float | None = None,
                       read: Reader | None = None, recheck: Recheck | None = None,
                       recheck_seconds: float = 30.0, max_life_seconds: float | None = None
                       ) -> AsyncGenerator[str, None]:
    """The session's events after ``after`` as Server-Sent Events (``id:`` is the seq), then live
    ones, with a comment line every HEARTBEAT_SECONDS; ends after ``max_seconds`` when given, with
    an ``access_revoked`` event when access is withdrawn, and with a ``reconnect`` event (and
    ``retry:``) at the end of its life: the client reconnects with Last-Event-ID."""
    first = True
    async with aclosing(session_events(session_id, after, max_seconds=max_seconds, read=read, recheck=recheck,
                                       recheck_seconds=recheck_seconds,
                                       max_life_seconds=max_life_seconds)) as events:
        async for event in events:
            if isinstance(event, StreamEnd):
                if event.reason == "reconnect":
                    yield "retry: 1000\n" + control_frame("reconnect", {"reason": "max_life",
                                                                        "last_seq": event.last_seq})
                else:
                    yield control_frame(event.reason, {"reason": event.reason})
            elif event is not None:
                yield sse_frame(event)
            else:
                yield ": connected\n\n" if first else ": heartbeat\n\n"
            first = False
