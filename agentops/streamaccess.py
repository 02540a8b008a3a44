"""Long-lived streams (WebSocket, SSE) keep checking who is on the other end.

A stream is authorised once, at connect; without more, a revoked token, a logout or a removed
team membership would keep receiving events for as long as the connection lives. So:

- every ``AGENTOPS_STREAM_RECHECK_SECONDS`` the stream re-reads its credential (the API token
  row, or the browser session) and the user's access to what it watches, and closes when either
  is gone;
- a stream lives at most ``AGENTOPS_STREAM_MAX_SECONDS``, then tells the client to reconnect
  (which re-authenticates, and resumes from its last seq: nothing is lost);
- replays from the database (the backlog on connect, a resend of a range) are rate-limited per
  user: ``AGENTOPS_STREAM_REPLAYS_PER_MINUTE`` across the process's streams.

A stream's first recheck comes at random within the first interval, and its end of life within
the last tenth of its life (``spread``), so that streams which connected together do not all
read the database, or all reconnect, in the same instant.
"""

import asyncio
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser

from agentops.asyncdb import database_read
from agentops.selectors import api_token_get


@dataclass(frozen=True)
class Credential:
    """What authenticated a stream: an API token, or a browser session's key."""

    kind: str  # "token" | "session"
    value: str
    user_id: int


def credential_of_request(request: Any) -> Credential:
    """The credential of an authenticated HTTP request (the Bearer token wins)."""
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return Credential("token", auth[7:].strip(), request.user.pk)
    return Credential("session", request.session.session_key or "", request.user.pk)


def credential_of_scope(scope: dict[str, Any]) -> Credential:
    """The credential of a WebSocket (channels' session middleware: the cookie's session)."""
    session = scope.get("session")
    return Credential("session", getattr(session, "session_key", "") or "", scope["user"].pk)


def spread(seconds: float, *, shortest: float = 0.5) -> float:
    """``seconds`` cut at random to between ``shortest`` of it and all of it: when a stream's first
    recheck (or its end of life) comes. Clients that connected together (a page of watchers opened
    at once, every browser coming back after a deploy) otherwise rechecked in the same instant ever
    after: in the load proof's push part, the 220 clients' rechecks every 30 s (six queries each,
    in the web processes' worker threads) held up every announcement for 100-200 ms, the p99 of
    the whole push. Staleness stays within one interval: later checks follow each other by the
    full interval."""
    return seconds * random.uniform(shortest, 1.0)


def user_if_still_valid(credential: Credential) -> AbstractBaseUser | None:
    """The credential's user, read now, when the credential still holds: the token is not revoked,
    the browser session still exists (a logout deletes it) and belongs to that user, and the user
    is active. None otherwise. One or two queries."""
    if credential.kind == "token":
        row = api_token_get(credential.value)
        return row.user if row is not None and row.user_id == credential.user_id else None
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=credential.value)
    if not credential.value or not store.exists(credential.value):
        return None
    if str(store.get("_auth_user_id", "")) != str(credential.user_id):
        return None
    user = get_user_model().objects.filter(pk=credential.user_id, is_active=True).first()
    return user


def still_allowed(credential: Credential, may: Callable[[Any], bool]) -> bool:
    """Does the credential still hold, and may its user (read now) still watch? ``may(user)`` is
    the stream's own access check (e.g. the session is still in the user's teams)."""
    user = user_if_still_valid(credential)
    return user is not None and may(user)


class ReplayLimiter:
    """A sliding one-minute window of replays per user, in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[Any, list[float]] = {}

    def allow(self, user_id: Any, *, now: float | None = None) -> bool:
        limit = settings.AGENTOPS_STREAM_REPLAYS_PER_MINUTE
        now = time.monotonic() if now is None else now
        with self._lock:
            recent = [t for t in self._seen.get(user_id, []) if now - t < 60]
            if len(recent) >= limit:
                self._seen[user_id] = recent
                return False
            recent.append(now)
            self._seen[user_id] = recent
            return True


replays = ReplayLimiter()


CLOSE_RECONNECT = 4000  # live.js reconnects (and so authenticates again) on any code but 4401/4403
CLOSE_FORBIDDEN = 4403


class Watchdog:
    """For a WebSocket consumer: re-check access every AGENTOPS_STREAM_RECHECK_SECONDS and end the
    connection past AGENTOPS_STREAM_MAX_SECONDS. ``may(user)`` runs in a worker thread (it reads
    the database); the consumer starts the watchdog once accepted and stops it on disconnect."""

    def __init__(self, consumer: Any, credential: Credential, may: Callable[[Any], bool]) -> None:
        self.consumer = consumer
        self.credential = credential
        self.may = may
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        end_of_life = loop.time() + spread(settings.AGENTOPS_STREAM_MAX_SECONDS, shortest=0.9)
        next_check = loop.time() + spread(settings.AGENTOPS_STREAM_RECHECK_SECONDS)
        check = database_read(still_allowed)
        while True:
            await asyncio.sleep(max(0.01, min(next_check, end_of_life) - loop.time()))
            if loop.time() >= end_of_life:
                await self.consumer.send_json({"type": "reconnect", "reason": "max_life"})
                await self.consumer.close(code=CLOSE_RECONNECT)
                return
            if not await check(self.credential, self.may):
                await self.consumer.send_json({"type": "closed", "reason": "access_revoked"})
                await self.consumer.close(code=CLOSE_FORBIDDEN)
                return
            next_check = loop.time() + settings.AGENTOPS_STREAM_RECHECK_SECONDS
