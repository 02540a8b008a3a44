"""WebSocket for the reviewers' queue: ``ws/approvals/``.

Forwards the ``approval.*`` events of every session (event + fragment, rendered once by the
sender). On (re)connect the client says when its page was current (``since``); the consumer
sends the approval events stored since then, in order, so a reconnect misses nothing. An event
committed while that backlog is read reaches the consumer twice (in the backlog, and live once the
backlog is sent): the live copy is dropped. Applying one twice would be harmless anyway: the
fragments upsert or remove one item by request id.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agentops.asyncdb import BadMessage, JsonConsumer, database_read
from agentops.models import Team
from agentops.permissions import VIEW_APPROVALS, has_perm
from agentops.streamaccess import CLOSE_RECONNECT, Watchdog, credential_of_scope
from agentops.teams import team_ids
from approvals_app.presence import PRESENCE_SECONDS, presence_load
from sessions_app import selectors
from sessions_app.announce import approvals_group, unbatch
from sessions_app.fragments import render_event_fragments

# An event is stamped inside its transaction, before it commits: look back a little further.
COMMIT_SKEW = timedelta(seconds=30)
BACKLOG_PAGE = 500
Position = tuple[datetime, int]  # (created_at, id) of the last event sent


def load_approval_events(user: Any, since: datetime,
                         after: Position | None = None) -> tuple[list[dict[str, Any]], Position | None]:
    """A page of the approval events of the user's teams stamped since ``since`` (after
    ``after``), each with its fragment, and where the next page starts."""
    rows = selectors.events_since(user=user, type_prefix="approval.", since=since - COMMIT_SKEW, limit=BACKLOG_PAGE,
                                  after=after)
    events = [e.as_dict() for e in rows]
    messages = [{"type": "event", "event": event, "html": html}
                for event, html in zip(events, render_event_fragments(events), strict=True)]
    return messages, ((rows[-1].created_at, rows[-1].id) if rows else after)


def _queue_groups(user: Any) -> list[str] | None:
    """The queue groups of the user's teams (every team for an admin); None: may not view."""
    if not has_perm(user, VIEW_APPROVALS):
        return None
    ids = team_ids(user)
    if ids is None:
        ids = list(Team.objects.values_list("id", flat=True))
    return [approvals_group(team_id) for team_id in ids]


class ApprovalsConsumer(JsonConsumer):
    groups_joined: list[str]
    ready: bool = False
    backlog_sent: set[tuple[str, int]]  # (session id, seq) of the hello's events
    watchdog: Watchdog | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        groups = await database_read(_queue_groups)(user)
        if groups is None:
            await self.close(code=4403)
            return
        self.groups_joined = groups
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        # The queue's groups are fixed at connect: a removed membership must end the connection
        # (the client reconnects with the groups it may still join).
        self.watchdog = Watchdog(self, credential_of_scope(self.scope),
                                 lambda u: _queue_groups(u) == groups)
        self.watchdog.start()

    async def disconnect(self, code: int) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """``{"type": "hello", "since": ISO-8601}``: the events since then, then live ones.
        ``{"type": "viewing", "token": ...}``: tell the team's reviewers who looks at a request."""
        if content.get("type") == "viewing":
            await self._viewing(content.get("token"))
            return
        if content.get("type") != "hello":
            raise BadMessage(f"Unknown message type {str(content.get('type'))[:40]!r}.",
                             details={"allowed": ["hello", "viewing"]})
        if self.ready:
            raise BadMessage("hello was already sent on this connection.", code="already_started")
        since = _since(content.get("since"))
        position: Position | None = None
        self.backlog_sent = set()
        read = database_read(load_approval_events, serving=True)
        while True:  # page by page until caught up: a reviewer back after a long absence misses nothing
            messages, position = await read(self.scope["user"], since, position)
            for message in messages:
                self.backlog_sent.add((message["event"]["session_id"], message["event"]["seq"]))
                await self.send_json(message)
            if len(messages) < BACKLOG_PAGE:
                break
        self.ready = True

    async def _viewing(self, token: Any) -> None:
        loaded = presence_load(token)
        if loaded is None:
            raise BadMessage("Invalid presence token.", code="invalid_arguments", details={"field": "token"})
        request_id, team_id = loaded
        group = approvals_group(team_id)
        if group not in self.groups_joined:
            raise BadMessage("Not a request of your teams.", code="not_found")
        await self.channel_layer.group_send(group, {"type": "presence.message", "request_id": request_id,
                                                    "user": self.scope["user"].get_username(),
                                                    "ttl": PRESENCE_SECONDS})

    async def presence_message(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "presence", "request_id": message["request_id"], "user": message["user"],
                              "ttl": message["ttl"]})

    async def event_message(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if self.ready and (event["session_id"], event["seq"]) not in self.backlog_sent:
            # Before the hello is done, an event is in its backlog or comes later; after, it may be both.
            await self.send_json({"type": "event", "event": message["event"], "html": message.get("html", "")})

    async def event_batch(self, message: dict[str, Any]) -> None:
        """Several approval events from one announcement, in order: each forwarded."""
        for item in unbatch(message):
            await self.event_message(item)

    async def layer_rejoined(self, message: dict[str, Any]) -> None:
        """Redis lost the groups (``agentops.channel_layer`` joined them again): approval events
        committed meanwhile reached nobody. The client reconnects and its hello reads them."""
        await self.send_json({"type": "reconnect", "reason": "layer_rejoined"})
        await self.close(code=CLOSE_RECONNECT)


def _since(value: Any) -> datetime:
    """The hello's ``since`` (now when absent), else BadMessage."""
    if value is None or value == "":
        return timezone.now()
    try:
        since = parse_datetime(value) if isinstance(value, str) and len(value) <= 64 else None
    except ValueError:  # well-formed but impossible, e.g. month 13
        since = None
    if since is None:
        raise BadMessage("since must be an ISO-8601 date and time.", code="invalid_arguments",
                         details={"field": "since"})
    since = since.replace(tzinfo=UTC) if timezone.is_naive(since) else since
    return max(since, EARLIEST)  # year 1 minus COMMIT_SKEW would overflow


EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
