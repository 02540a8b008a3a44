"""Database reads from async code (consumers, the SSE stream, the WebSocket login), off the
thread that runs Django's sync views.

Channels' ``database_sync_to_async`` is thread-sensitive: in one daphne process every sync view
and every consumer's database call share one thread, so under load each WebSocket connect,
backlog and gap read waits behind every HTTP request the process serves (measured: connects
beyond daphne's 5 s accept window, the client reset). These reads run in worker threads instead;
each hands its connection back when done (to the pool on PostgreSQL).

The worker threads take the reads of connections already open (a WebSocket's backlog and gaps,
an SSE stream's pages: ``serving=True``) before those of connections still being opened (the
login, the permission checks) and the periodic re-checks. With one first-come queue, 200
WebSockets opened at once while sessions were being created made a client that had just sent its
hello wait behind the other clients' logins: its first live events arrived 1-2 s late, the tail
of the push latency (``bench/concurrency.py``, issue 10).
"""

import logging
import os
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from autobahn.exception import Disconnected
from channels.auth import AuthMiddleware, get_user
from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.middleware import BaseMiddleware
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from agentops.parser import INT64, json_loads_strict

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


MAX_READ_ATTEMPTS = 12  # above the pool's size: each of its idle connections may be dead


def _connection_lost() -> bool:
    """Did the server close this thread's connection (a restart, pg_terminate_backend)?"""
    raw = connection.connection
    return raw is None or bool(getattr(raw, "closed", True))


_Work = tuple[Future[Any], Callable[[], Any]]


class Lanes:
    """Worker threads (at most ``size``, started as work comes) shared by two lanes. A free thread
    takes the oldest work of lane 0, else the oldest of lane 1 while fewer than ``second_lane``
    threads run lane 1's: work of lane 1 can never hold every thread, nor the GIL from many threads
    at once. ``lane(n)`` is an ``Executor`` for ``loop.run_in_executor`` / asgiref."""

    def __init__(self, size: int, second_lane: int, name: str) -> None:
        self.size, self.name = max(1, size), name
        self._caps = (self.size, max(1, min(second_lane, self.size)))
        self._queues: tuple[deque[_Work], deque[_Work]] = (deque(), deque())
        self._running = [0, 0]
        self._cond = threading.Condition()
        self._threads = self._idle = 0

    def lane(self, n: int) -> Executor:
        return _Lane(self, n)

    def submit(self, lane: int, call: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._cond:
            self._queues[lane].append((future, call))
            if self._idle:
                self._cond.notify()
            elif self._threads < self.size:
                self._threads += 1
                threading.Thread(target=self._worker, name=f"{self.name}-{self._threads}", daemon=True).start()
        return future

    def _take(self) -> tuple[int, _Work] | None:
        for lane, (waiting, cap) in enumerate(zip(self._queues, self._caps, strict=True)):
            if waiting and self._running[lane] < cap:
                self._running[lane] += 1
                return lane, waiting.popleft()
        return None

    def _worker(self) -> None:
        done: int | None = None
        while True:
            with self._cond:
                if done is not None:
                    self._running[done] -= 1
                while (taken := self._take()) is None:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
            done, (future, call) = taken
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # the caller's to handle, as in ThreadPoolExecutor
                    future.set_exception(exc)
            del future, call, taken


class _Lane(Executor):
    def __init__(self, lanes: Lanes, n: int) -> None:
        self.lanes, self.n = lanes, n

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        return self.lanes.submit(self.n, lambda: fn(*args, **kwargs))


READS = Lanes(int(os.environ.get("AGENTOPS_READ_THREADS", "0")) or min(32, (os.cpu_count() or 1) + 4),
              int(os.environ.get("AGENTOPS_ADMIT_THREADS", "2")), "db-read")
SERVING, ADMITTING = READS.lane(0), READS.lane(1)


def database_read(fn: Callable[P, R], *, serving: bool = False) -> Callable[P, Awaitable[R]]:
    """``fn`` (which reads the database) as a coroutine function run in a worker thread
    (``serving``: for a connection already open, ahead of the others). A read
    that meets a connection the server closed runs again on another: after a PostgreSQL restart
    or a cut, the pool still hands out its dead idle connections one by one (measured: a stream's
    re-read right after a cut died with "terminating connection due to administrator command")."""

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        close_old_connections()
        try:
            for attempt in range(1, MAX_READ_ATTEMPTS + 1):
                try:
                    return fn(*args, **kwargs)
                except (OperationalError, InterfaceError):
                    if attempt == MAX_READ_ATTEMPTS or not _connection_lost():
                        raise
                    connection.close()  # back to the pool, which discards it
            raise AssertionError("unreachable")
        finally:
            close_old_connections()

    # asgiref annotates ThreadPoolExecutor; it hands the executor to loop.run_in_executor, any Executor.
    return sync_to_async(run, thread_sensitive=False,  # type: ignore[call-overload]
                         executor=SERVING if serving else ADMITTING)


_get_user = database_read(get_user.func)  # channels' own lookup, without its thread-sensitive wrapper


class OffThreadAuthMiddleware(AuthMiddleware):
    """Channels' AuthMiddleware, looking the user up in a worker thread."""

    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        scope["user"]._wrapped = await _get_user(scope)


def AuthMiddlewareStack(inner: Any) -> BaseMiddleware:  # noqa: N802 (named like channels' own)
    return CookieMiddleware(SessionMiddleware(OffThreadAuthMiddleware(inner)))


MAX_MESSAGE_CHARS = 16_000  # ours are a few dozen characters


class BadMessage(ValueError):
    """A client message the consumer cannot act on: answered with an error message, never a crash."""

    def __init__(self, message: str, *, code: str = "bad_message", details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details or {}


def message_int(content: dict[str, Any], name: str, default: int) -> int:
    """A non-negative integer field of a client message (``default`` when absent), else BadMessage."""
    value = content.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < INT64:
        raise BadMessage(f"{name} must be an integer from 0 to 2^63-1", code="invalid_arguments",
                         details={"field": name})
    return value


class JsonConsumer(AsyncJsonWebsocketConsumer):
    """A JSON WebSocket consumer whose messages never wait for the sync-view thread, and which
    answers a message it cannot use with ``{"type": "error", "code", "message", "details"}``
    (the API's error shape) instead of dying with the connection: a binary frame, text that is
    not JSON (or JSON nothing below can hold: NaN, NUL, 64-bit overflow, deep nesting, see
    ``agentops.parser``), a message over MAX_MESSAGE_CHARS, an unknown type or a bad field.
    Such a message changes nothing.

    Channels' AsyncConsumer.dispatch runs ``close_old_connections`` on that one thread before
    every message: every live event, for every connected client, queued behind every HTTP request
    of the process (measured: seconds of push latency with 200 watchers). Our consumers touch the
    database only through ``database_read``, which hands its connection back itself.
    """

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        try:
            if text_data is None:
                raise BadMessage("Messages are JSON text frames, not binary.")
            if len(text_data) > MAX_MESSAGE_CHARS:
                raise BadMessage(f"The message is over {MAX_MESSAGE_CHARS} characters.", code="message_too_large",
                                 details={"limit": MAX_MESSAGE_CHARS})
            try:
                content = json_loads_strict(text_data)
            except ValueError as exc:
                raise BadMessage("The message is not valid JSON.", code="malformed_json",
                                 details={"error": str(exc)[:300]}) from exc
            if not isinstance(content, dict) or not isinstance(content.get("type"), str):
                raise BadMessage('A message is a JSON object with a "type".')
            await self.receive_json(content, **kwargs)
        except BadMessage as exc:
            await self.send_json({"type": "error", "code": exc.code, "message": exc.message, "details": exc.details})

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        try:
            await handler(message)
        except Disconnected:
            # The browser left (a reload, a click away) while a live event was on its way to it:
            # nothing is lost (the next page reads from the database) and daphne delivers the
            # disconnect next. It was an ERROR with a traceback in daphne's log at every such reload.
            log.debug("websocket %s: the client left before a %s reached it", self.scope.get("path"), message["type"])



