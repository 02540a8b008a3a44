"""WebSocket for a session's live timeline: ``ws/sessions/<id>/``.

The client says which ``seq`` it rendered last (``hello``); the consumer sends the missed events
from the database, then forwards live ones, each once and in order (``streams.EventFeed``, the
algorithm the SSE stream uses too). The group message already carries the event and its HTML
fragment, rendered once by the sender: this consumer reads the database on connect and on a gap
only, never per message (that collapses at 200 clients, DESIGN.md "Live progress"). A client
can also ask again for a range it misses (``resend``).
"""

import time
from typing import Any

from agentops.asyncdb import BadMessage, JsonConsumer, database_read, message_int
from agentops.permissions import VIEW_SESSIONS, has_perm
from agentops.streamaccess import ReplayLimiter, Watchdog, credential_of_scope
from sessions_app import selectors
from sessions_app.announce import session_group, unbatch
from sessions_app.fragments import render_event_fragments
from sessions_app.streams import EventFeed, Message

BACKLOG_BATCH = 200
MAX_RESEND = 5000
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


def load_messages(session_id: Any, after: int, until: int | None, limit: int) -> list[Message]:
    """Stored events with ``after < seq <= until``, each with its fragment. Six queries at most."""
    events = [e.as_dict() for e in selectors.events_after(session_id=session_id, after=after, until=until,
                                                          limit=limit)]
    return [{"type": "event", "event": event, "html": html}
            for event, html in zip(events, render_event_fragments(events), strict=True)]


def _may_view(user: Any, session_id: Any) -> bool:
    """May ``user`` watch this session: the permission, and the session in one of their teams."""
    return has_perm(user, VIEW_SESSIONS) and selectors.session_exists(session_id, user=user)


class SessionConsumer(JsonConsumer):
    session_id: str
    group: str = ""
    watchdog: Watchdog | None = None
    feed: EventFeed | None = None  # set by the hello

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        if not await database_read(_may_view)(user, self.session_id):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.group = session_group(self.session_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        session_id = self.session_id
        self.watchdog = Watchdog(self, credential_of_scope(self.scope), lambda u: _may_view(u, session_id))
        self.watchdog.start()
        self.replays = ReplayLimiter()

    async def disconnect(self, code: int) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def _read(self, after: int, until: int | None, limit: int) -> list[Message]:
        messages: list[Message] = await database_read(load_messages, serving=True)(self.session_id, after, until, limit)
        return messages

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """``{"type": "hello", "last_seq": n}`` once, then ``{"type": "resend", "after": a, "until": b}``."""
        kind = content.get("type")
        if kind == "hello":
            if self.feed is not None:
                raise BadMessage("hello was already sent on this connection.", code="already_started")
            feed = EventFeed(self._read, after=message_int(content, "last_seq", 0), page=BACKLOG_BATCH)
            async for message in feed.backlog():
                await self.send_json(message)
            self.feed = feed
        elif kind == "resend":
            if self.feed is None:
                raise BadMessage("Send hello before resend.", code="not_started")
            if not self.replays.allow(self.channel_name):
                await self.send_json({"type": "error", "code": "throttled",
                                      "message": "Too many resends; wait a minute."})
                return
            after = message_int(content, "after", 0)
            until = message_int(content, "until", after + 1)
            if until < after:
                raise BadMessage("until must not be below after.", code="invalid_arguments",
                                 details={"field": "until"})
            async for message in self.feed.replay(after, min(until, after + MAX_RESEND)):
                await self.send_json(message)
        else:
            raise BadMessage(f"Unknown message type {str(kind)[:40]!r}.", details={"allowed": ["hello", "resend"]})

    async def event_message(self, message: dict[str, Any]) -> None:
        # Messages handled before the hello are in the hello's backlog: they were committed
        # before it was read (consumers handle one message at a time, in order).
        if self.feed is None:
            return
        live = {"type": "event", "event": message["event"], "html": message.get("html", "")}
        if "announced_at" in message:  # the sender's clock when it sent it (a measure, never a state)
            live["announced_at"] = message["announced_at"]
        if "stages" in message:  # AGENTOPS_PUSH_TIMINGS: the sender's stages (committed, picked, listened, rendered)
            live["stages"] = message["stages"]
            live["forwarded_at"] = time.time()  # and this process's: when its consumer took the message
        async for out in self.feed.live(live):
            await self.send_json(out)

    async def event_batch(self, message: dict[str, Any]) -> None:
        """Several events of the session from one announcement, in seq order: each forwarded."""
        for item in unbatch(message):
            await self.event_message(item)

    async def layer_rejoined(self, message: dict[str, Any]) -> None:
        """Redis lost the groups and the layer joined ours again (``agentops.channel_layer``):
        what was committed meanwhile reached nobody, so read it from the database."""
        if self.feed is None:
            return  # the hello's backlog will read it
        async for out in self.feed.backlog():
            await self.send_json(out)

