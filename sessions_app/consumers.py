"""WebSocket for a session's live timeline: ``ws/sessions/<id>/``.

The client says which ``seq`` it rendered last (``hello``); the consumer sends the missed events
from the database, then forwards live ones. The group message already carries the event and its
HTML fragment, rendered once by the sender: this consumer never reads the database per message
(that collapses at 200 clients, DESIGN.md "Live progress"). The channel layer is at-most-once, so
the client asks for a range it missed (``resend``) and gets it from the database.
"""

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from agentops.permissions import VIEW_SESSIONS, has_perm
from sessions_app import selectors
from sessions_app.announce import session_group
from sessions_app.fragments import render_event_fragments

BACKLOG_BATCH = 200
MAX_RESEND = 5000
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


def load_events(session_id: Any, after: int, until: int | None, limit: int) -> list[dict[str, Any]]:
    """Stored events after ``after`` (up to ``until``), each with its fragment. Four queries at most."""
    events = [e.as_dict() for e in selectors.events_after(session_id=session_id, after=after, until=until,
                                                          limit=limit)]
    return [{"type": "event", "event": event, "html": html}
            for event, html in zip(events, render_event_fragments(events), strict=True)]


def _may_view(user: Any, session_id: Any) -> bool:
    return has_perm(user, VIEW_SESSIONS) and selectors.session_exists(session_id)


class SessionConsumer(AsyncJsonWebsocketConsumer):
    session_id: str
    group: str = ""
    ready: bool = False
    last_sent: int = 0

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        if not await database_sync_to_async(_may_view)(user, self.session_id):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.group = session_group(self.session_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            return
        kind = content.get("type")
        if kind == "hello":
            await self._send_range(_int(content.get("last_seq"), 0), None)
            self.ready = True
        elif kind == "resend" and self.ready:
            after = _int(content.get("after"), 0)
            until = _int(content.get("until"), after + 1)
            await self._send_range(after, min(until, after + MAX_RESEND))

    async def _send_range(self, after: int, until: int | None) -> None:
        while True:
            batch = await database_sync_to_async(load_events)(self.session_id, after, until, BACKLOG_BATCH)
            for message in batch:
                await self.send_json(message)
                after = message["event"]["seq"]
                self.last_sent = max(self.last_sent, after)
            if len(batch) < BACKLOG_BATCH:
                return

    async def event_message(self, message: dict[str, Any]) -> None:
        # Messages handled before the hello are in the hello's backlog: they were committed
        # before it was read (consumers handle one message at a time, in order).
        if not self.ready:
            return
        seq = int(message["event"]["seq"])
        if seq <= self.last_sent:
            return  # already sent from the backlog
        self.last_sent = seq
        await self.send_json({"type": "event", "event": message["event"], "html": message.get("html", "")})


def _int(value: Any, default: int) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return default
