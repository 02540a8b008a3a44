"""Database reads from async code (consumers, the SSE stream, the WebSocket login), off the
thread that runs Django's sync views.

Channels' ``database_sync_to_async`` is thread-sensitive: in one daphne process every sync view
and every consumer's database call share one thread, so under load each WebSocket connect,
backlog and gap read waits behind every HTTP request the process serves (measured: connects
beyond daphne's 5 s accept window, the client reset). These reads run in worker threads instead;
each hands its connection back when done (to the pool on PostgreSQL).
"""

from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from channels.auth import AuthMiddleware, get_user
from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.middleware import BaseMiddleware
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.db import close_old_connections

P = ParamSpec("P")
R = TypeVar("R")


def database_read(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``fn`` (which reads the database) as a coroutine function run in a worker thread."""

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(run, thread_sensitive=False)


_get_user = database_read(get_user.func)  # channels' own lookup, without its thread-sensitive wrapper


class OffThreadAuthMiddleware(AuthMiddleware):
    """Channels' AuthMiddleware, looking the user up in a worker thread."""

    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        scope["user"]._wrapped = await _get_user(scope)


def AuthMiddlewareStack(inner: Any) -> BaseMiddleware:  # noqa: N802 (named like channels' own)
    return CookieMiddleware(SessionMiddleware(OffThreadAuthMiddleware(inner)))


class JsonConsumer(AsyncJsonWebsocketConsumer):
    """A JSON WebSocket consumer whose messages never wait for the sync-view thread.

    Channels' AsyncConsumer.dispatch runs ``close_old_connections`` on that one thread before
    every message: every live event, for every connected client, queued behind every HTTP request
    of the process (measured: seconds of push latency with 200 watchers). Our consumers touch the
    database only through ``database_read``, which hands its connection back itself.
    """

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)



