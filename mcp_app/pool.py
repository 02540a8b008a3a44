"""Where MCP calls run: one asyncio loop per worker process, in its own thread, that keeps the
long-lived stdio servers and runs every call (stdio and HTTP) under its deadline.

**One stdio server process per (session, server), kept alive between calls.** Per session, not per
team: a stdio server runs with the session's workspace at /workspace and may keep state in its
memory, so a process shared by a team would let one session read or steer another's (the sandbox
would no longer separate them), and one poisoned or stuck process would fail every session of the
team. The process starts at the session's first call of that server, is reused by its later
calls (a call is then one request over an open pipe, not a sandbox start plus an interpreter
start), and ends when: it has been idle ``AGENTOPS_MCP_STDIO_IDLE_SECONDS`` (0: a fresh process per
call), the session is deleted, the server's configuration or a resolved secret changed (another
key), a call timed out or was cancelled and the server did not answer a ping within a second, it
wrote something that is not JSON-RPC, or it died. It lives in the worker process that runs the
session's sandbox work (the ``sandbox``/``sandbox.<host>`` queue routes the session's calls to its
host); a worker that exits takes its servers with it (their stdin closes; the process group is
killed at exit).

The calling (Celery) thread never blocks without bound: it waits for the call in short slices and
polls the step's cancellation between them; a cancelled call gets ``notifications/cancelled`` for
its request and is abandoned within ``CANCEL_POLL_SECONDS`` + ``CANCEL_GRACE_SECONDS``. Database
access stays in the calling thread (the loop thread only checks, off-loop, which sessions still
exist).
"""

import asyncio
import atexit
import concurrent.futures
import contextlib
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
from django.conf import settings
from mcp import ClientSession, types

from agentops.domain import canonical_json

from .stdio import StdioTrouble

log = logging.getLogger(__name__)
T = TypeVar("T")
CANCEL_POLL_SECONDS = 0.25
CANCEL_GRACE_SECONDS = 2.0  # after a cancel: the notification is sent and the call's task unwinds
PING_GRACE_SECONDS = 1.0  # a cancelled or timed-out server that does not answer a ping in this is stopped
SESSION_CHECK_SECONDS = 30.0

Opener = Callable[[Any, StdioTrouble, bool], AbstractAsyncContextManager[ClientSession]]


class CallCancelled(Exception):
    """The step was cancelled while its MCP call ran; the server was told."""


class _Ended(Exception):
    """The kept process ended before this call was sent."""


class StaleServer(Exception):
    """Raised by a call's body when the server no longer declares the tool as discovered. A kept
    process started before a discovery may run the old code: it is replaced and the call tried
    once more on a fresh one (nothing ran: the check comes before the call); a fresh process
    that disagrees is the server's real answer, ``failure``."""

    def __init__(self, failure: Exception) -> None:
        super().__init__(str(failure))
        self.failure = failure


@dataclass(eq=False)
class LiveServer:
    """One long-lived server process and its open MCP session (loop thread only)."""

    key: str
    session_id: str
    trouble: StdioTrouble
    last_used: float = field(default_factory=time.monotonic)
    session: ClientSession | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one request at a time per process
    error: BaseException | None = None
    task: asyncio.Task[None] | None = None
    calls: int = 0

    @property
    def usable(self) -> bool:
        closed = self.trouble.closed is not None and self.trouble.closed.is_set()
        return self.session is not None and not self.stop.is_set() and not closed and not self.trouble.malformed


def idle_seconds() -> float:
    return float(getattr(settings, "AGENTOPS_MCP_STDIO_IDLE_SECONDS", 300))


def live_key(conn: Any, session_id: str) -> str:
    """Which process serves a call: the session plus everything the process was started with
    (argv, mounts, network, workspace, resolved env). Kept in memory only; a changed secret or
    configuration is another key, so a new process."""
    doc = {"session": session_id, "name": conn.name, "command": conn.command, "mounts": conn.mounts,
           "env": conn.env, "network": conn.network, "workspace": str(conn.workspace), "timeout": conn.timeout}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


class McpCallPool:
    """Per worker process. ``run`` is called from any thread; everything else runs on the loop."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._live: dict[str, LiveServer] = {}

    # --- the calling thread -------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._loop is None or self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()  # a forked child starts its own: the parent's thread is gone
                thread = threading.Thread(target=self._serve, args=(loop,), name="mcp-call-pool", daemon=True)
                self._loop, self._thread, self._pid, self._live = loop, thread, os.getpid(), {}
                thread.start()
            return self._loop

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.create_task(self._reaper())
        loop.run_forever()

    def run(self, conn: Any, body: Callable[[ClientSession], Awaitable[T]], *, opener: Opener,
            trouble: StdioTrouble, session_id: str = "", should_cancel: Callable[[], bool] | None = None) -> T:
        """Run ``body`` on a session with the server under ``conn.timeout``: a kept process when
        ``session_id`` is given for a stdio server and idle keeping is on, else a connection of its
        own. Raises what the call raised (the caller classifies), or CallCancelled."""
        loop = self._ensure_loop()
        cancel = threading.Event()
        keep = bool(session_id) and conn.transport == "stdio" and idle_seconds() > 0
        coro = self._call_kept(conn, body, session_id, trouble, cancel, opener) if keep \
            else self._call_once(conn, body, trouble, cancel, opener)
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        hard_stop = time.monotonic() + conn.timeout + CANCEL_GRACE_SECONDS + 5  # the loop's own deadline first
        # Waits with concurrent.futures.wait, not result(timeout): since 3.11 the call's own
        # TimeoutError (its deadline) and result()'s "not yet" are the same class.
        while not concurrent.futures.wait([future], timeout=CANCEL_POLL_SECONDS).done:
            if should_cancel is not None and should_cancel():
                cancel.set()
                if concurrent.futures.wait([future], timeout=CANCEL_GRACE_SECONDS).done:
                    return future.result()
                future.cancel()
                raise CallCancelled()
            if time.monotonic() > hard_stop:
                future.cancel()
                raise TimeoutError()
        return future.result()

    def stop_all(self, timeout: float = 10) -> None:
        """Stop every kept process of this worker (at exit; tests between cases)."""
        loop = self._loop
        if loop is None or self._pid != os.getpid() or not loop.is_running():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop_keys(None), loop).result(timeout)

    def live_count(self, session_id: str | None = None) -> int:
        return sum(1 for live in list(self._live.values()) if session_id is None or live.session_id == session_id)

    # --- the loop thread ----------------------------------------------------------------------
    async def _call_once(self, conn: Any, body: Callable[[ClientSession], Awaitable[T]], trouble: StdioTrouble,
                         cancel: threading.Event, opener: Opener) -> T:
        with anyio.fail_after(conn.timeout):
            async with opener(conn, trouble, False) as session:
                try:
                    return await self._guarded(session, body, cancel)
                except StaleServer as exc:
                    raise exc.failure from None

    async def _call_kept(self, conn: Any, body: Callable[[ClientSession], Awaitable[T]], session_id: str,
                         trouble: StdioTrouble, cancel: threading.Event, opener: Opener) -> T:
        with anyio.fail_after(conn.timeout):  # start-up (when needed) + the call: one deadline, as per call
            retried_stale = False
            while True:
                live = await self._acquire(conn, session_id, opener)
                try:
                    return await self._call_live(live, body, trouble, cancel)
                except _Ended:
                    await self._retire(live)  # nothing of this call ran: a new process takes it
                except StaleServer as exc:
                    if retried_stale or live.calls == 1:  # a fresh process said so: the server really changed
                        raise exc.failure from None
                    retried_stale = True
                    await self._retire(live)

    async def _call_live(self, live: LiveServer, body: Callable[[ClientSession], Awaitable[T]],
                         trouble: StdioTrouble, cancel: threading.Event) -> T:
        async with live.lock:
            if not live.usable:  # ended while this call waited behind another one
                raise _Ended()
            assert live.session is not None
            live.calls += 1
            healthy = False
            try:
                result = await self._guarded(live.session, body, cancel)
                healthy = True
                return result
            except StaleServer:
                healthy = True
                raise
            finally:
                live.last_used = time.monotonic()
                trouble.malformed = live.trouble.malformed
                trouble.stderr[:] = live.trouble.stderr
                if not healthy and live.usable:
                    await self._check_alive(live)
                if not live.usable:
                    live.stop.set()

    async def _guarded(self, session: ClientSession, body: Callable[[ClientSession], Awaitable[T]],
                       cancel: threading.Event) -> T:
        """``body`` raced against the step's cancellation; a cancelled request is cancelled on
        the server too (``notifications/cancelled``), never silently left running."""
        first_id = session._request_id  # the SDK numbers requests; the last one sent is in flight
        task = asyncio.ensure_future(body(session))
        try:
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=CANCEL_POLL_SECONDS)
                if not done and cancel.is_set():
                    raise CallCancelled()
            return task.result()
        except BaseException as exc:  # cancelled by the step, or by the deadline (fail_after)
            if not task.done():
                task.cancel()
                with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
                    await task
                why = "the step was cancelled" if isinstance(exc, CallCancelled) else "the call's deadline passed"
                await self._notify_cancelled(session, first_id, why)
            raise

    async def _notify_cancelled(self, session: ClientSession, first_id: int, reason: str) -> None:
        last = session._request_id - 1
        if last < first_id:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(PING_GRACE_SECONDS), \
                contextlib.suppress(Exception):
            await session.send_notification(types.ClientNotification(types.CancelledNotification(
                params=types.CancelledNotificationParams(requestId=last, reason=reason))))

    async def _check_alive(self, live: LiveServer) -> None:
        """After a failed call: a server that does not answer a ping is not given another call."""
        assert live.session is not None
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(PING_GRACE_SECONDS) as scope, contextlib.suppress(Exception):
                await live.session.send_ping()
            if scope.cancelled_caught or not live.usable:
                live.stop.set()

    async def _acquire(self, conn: Any, session_id: str, opener: Opener) -> LiveServer:
        key = live_key(conn, session_id)
        live = self._live.get(key)
        if live is not None and not live.usable and live.ready.is_set():
            await self._retire(live)
            live = None
        if live is None:
            trouble = StdioTrouble(closed=anyio.Event())
            live = LiveServer(key=key, session_id=session_id, trouble=trouble)
            self._live[key] = live
            live.task = asyncio.ensure_future(self._own(live, conn, opener))
        await live.ready.wait()
        if live.error is not None or live.session is None:
            if self._live.get(key) is live:
                del self._live[key]
            raise live.error or RuntimeError("the MCP server stopped while starting")
        return live

    async def _own(self, live: LiveServer, conn: Any, opener: Opener) -> None:
        """Owns the process: enters and leaves its context in one task (anyio's cancel scopes
        require it), and holds it until told to stop or the server's stdout ends."""
        try:
            async with opener(conn, live.trouble, True) as session:
                live.session = session
                live.ready.set()
                await live.stop.wait()
        except Exception as exc:  # start-up failures go to the waiting call, which classifies them
            live.error = exc
        finally:
            live.session = None
            live.stop.set()
            live.ready.set()
            if self._live.get(live.key) is live:
                del self._live[live.key]

    async def _retire(self, live: LiveServer) -> None:
        live.stop.set()
        if live.task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(live.task), 10)

    async def _stop_keys(self, keys: set[str] | None) -> None:
        doomed = [live for key, live in list(self._live.items()) if keys is None or key in keys]
        await asyncio.gather(*(self._retire(live) for live in doomed), return_exceptions=True)

    async def _reaper(self) -> None:
        """Idle servers, dead ones and those of deleted sessions are stopped."""
        last_session_check = time.monotonic()
        while True:
            await asyncio.sleep(max(0.5, min(idle_seconds() / 4, 5.0)) if idle_seconds() > 0 else 5.0)
            now = time.monotonic()
            idle = {live.key for live in self._live.values() if not live.lock.locked() and live.ready.is_set()
                    and (not live.usable or now - live.last_used > idle_seconds())}
            if idle:
                await self._stop_keys(idle)
            if self._live and now - last_session_check > SESSION_CHECK_SECONDS:
                last_session_check = now
                ids = {live.session_id for live in self._live.values()}
                with contextlib.suppress(Exception):
                    gone = await asyncio.to_thread(_sessions_gone, ids)
                    doomed = {live.key for live in self._live.values()
                              if live.session_id in gone and not live.lock.locked()}
                    await self._stop_keys(doomed)


def _sessions_gone(ids: set[str]) -> set[str]:
    """Which of these sessions were deleted (off the loop; its own connection, closed after)."""
    from django.db import connection

    from sessions_app.models import AgentSession

    valid = set()
    for value in ids:
        with contextlib.suppress(ValueError):
            valid.add(str(uuid.UUID(value)))
    try:
        present = {str(pk) for pk in AgentSession.objects.filter(pk__in=valid).values_list("pk", flat=True)}
    finally:
        connection.close()
    return valid - present


_POOL = McpCallPool()


def call_pool() -> McpCallPool:
    return _POOL


atexit.register(_POOL.stop_all)

