"""The model gateway: one asyncio process makes the model calls of many turns at once.

A model call waits seconds on the model and needs no database meanwhile, so it must hold neither
a worker thread nor a connection: the gateway awaits it on its event loop, and runs the short
database work around it (tick, claim, record) in a small pool of threads, each handing its
connection back to the pool when done.

Hand-off: ticks put planned model steps on a Redis stream (``agentops.dispatch``). The gateway
reads it in a consumer group, ticks the turn in the database (which claims the model step with a
lease, or finds it claimed: a duplicate does nothing) and only then acknowledges the entry. An
entry read by a gateway that died before that is claimed again by another one (XAUTOCLAIM). Once a
step is claimed, the database holds the truth: the gateway renews the leases of the steps it
drives; a gateway that dies lets them expire and the sweeper re-issues the calls.

A turn's loop, as in Celery's ``tick.turn_advance`` but with the model call awaited::

    tick (claims the model step) → call the model → record the reply
        → read-only tools inline, next model step claimed in the same write → call … → tick

One module (~600 lines) on purpose: it is the ``Gateway`` class and the few helpers it runs
with; its two halves (driving a turn's calls; the stream it reads, with the re-claim, the share a
busy gateway takes, the lease renewal and the heartbeat) share the instance's ``held`` steps and
slots, which decide what is driven, how long a turn stays (``full``, ``stopping``) and which
leases are renewed. The calls themselves (``llm``), the records and the conversation
(``model_step``, ``record``) are modules of their own.
"""

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import redis.asyncio as aioredis
from django.conf import settings
from django.db import connection

from agentops.dispatch import MODEL_GROUP, MODEL_STREAM
from sessions_app.engine import llm
from sessions_app.engine.compaction import compaction_record_atomic, compaction_request
from sessions_app.engine.dbpool import DbPool
from sessions_app.engine.model_step import Conversation, Ticked, model_failure_record, model_reply_apply
from sessions_app.engine.prohibitions import calls_to_check, checks_parse, checks_unavailable, prohibitions_request
from sessions_app.engine.tick import INLINE_SECONDS, Claimed, turn_tick
from sessions_app.engine.tool_steps import tool_step_execute
from sessions_app.engine.verification import verification_record_atomic, verification_request
from sessions_app.events import event_record
from sessions_app.models import Step
from sessions_app.selectors import steps_still_held, turn_id_of_step
from sessions_app.services import step_leases_renew

log = logging.getLogger(__name__)
T = TypeVar("T")

READ_BATCH = 100
BUSY_PAUSE_SECONDS = 0.02  # a gateway whose database threads are behind looks again after this
HEARTBEAT_SECONDS = 5.0  # /healthz sees a dead gateway gone within 3 beats (it said alive 25-30 s at 10)
READER_IDLE_MS = 5000  # a consumer of the group that read this recently is a gateway reading the stream
HEARTBEAT_KEY = "agentops:gateway:"
LOAD_KEY = "agentops:gateways-load"  # a hash: gateway name → "<turns driven> <unix time>" (not under HEARTBEAT_KEY)
# A gateway that has not said its load for this long is gone: three heartbeats, as /healthz judges
# it. Not less: in a burst of new sessions the gateways (at nice 10) get no CPU for seconds, and at
# 3 s the first of two to wake saw the other "gone" and took the whole burst (bench/concurrency.py
# N = 300 on a slow 2-CPU machine: both silent 3 s, then one read 205 entries; 270 turns to 30).
LOAD_FRESH_SECONDS = 3 * HEARTBEAT_SECONDS
BALANCE_SLACK = 8  # turns a gateway may drive above the gateways' mean before it leaves new ones to the others


def _pooled() -> bool:
    return bool(settings.DATABASES["default"].get("OPTIONS", {}).get("pool"))


def _db_threads(requested: int) -> int:
    """The gateway's database threads: at most one fewer than the process's pooled connections,
    so that its announcer (which reads the rows it renders) never queues behind them."""
    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    size = pool.get("max_size") if isinstance(pool, dict) else None
    if size is None or requested < size:
        return requested
    threads = max(1, size - 1)
    log.warning("model gateway: %d database threads on a pool of %d connections; using %d, one connection "
                "left for the announcer (raise AGENTOPS_DB_POOL_SIZE for more)", requested, size, threads)
    return threads


def _uuid(value: bytes | None) -> uuid.UUID | None:
    """An id from a stream entry's field; None when absent or malformed (then it is looked up)."""
    try:
        return uuid.UUID(value.decode()) if value else None
    except (ValueError, UnicodeDecodeError):
        return None


def _cancelling(task: "asyncio.Task[Any] | None") -> bool:
    """Was this task itself asked to stop (the gateway's shutdown), not only a call it awaited?"""
    return task is not None and task.cancelling() > 0


def _db_call(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    try:
        return fn(*args, **kwargs)
    finally:
        if _pooled():
            connection.close()  # back to the pool: a thread holds a connection only while it works


class Gateway:
    """Reads planned model steps from the stream and drives their turns, ``concurrency`` at once."""

    def __init__(self, *, concurrency: int | None = None, db_threads: int | None = None,
                 clients_per_endpoint: int = 8, name: str | None = None, db_in_loop: bool = False,
                 reclaim_after_seconds: float | None = None, watch_seconds: float | None = None) -> None:
        """``db_in_loop`` runs the database work on the event loop's own thread, blocking it: only
        for a test that drives one turn and counts its queries on that thread.
        ``reclaim_after_seconds``: an entry read that long ago and never acknowledged belongs to a
        gateway that is gone, and is taken over."""
        self.concurrency = concurrency or settings.AGENTOPS_GATEWAY_CONCURRENCY
        self.reclaim_after = reclaim_after_seconds or settings.AGENTOPS_GATEWAY_RECLAIM_SECONDS
        self.watch_seconds = watch_seconds or settings.AGENTOPS_GATEWAY_WATCH_SECONDS
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.db_threads = _db_threads(db_threads or settings.AGENTOPS_GATEWAY_DB_THREADS)
        self._executor = None if db_in_loop else DbPool(self.db_threads)
        self.db_waiting = 0  # database calls submitted and not finished (running or queued)
        self._clients_per_endpoint = clients_per_endpoint
        self.clients: llm.ModelClients | None = None
        self.held: dict[uuid.UUID, str] = {}  # model steps this gateway drives now → their lease owner
        self.calls: dict[uuid.UUID, asyncio.Task[llm.ModelReply]] = {}  # their model calls in flight
        # Steps settled elsewhere whose calls the watch let go: a CancelledError raised inside a call
        # (a dying worker, as tests simulate) is not a let-go, so the cancelled task alone cannot tell.
        self.dropped: set[uuid.UUID] = set()
        self.in_flight = 0
        self.peak_in_flight = 0
        self._stopping: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- the database, off the event loop -----------------------------------------------------

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run synchronous database work in one of the gateway's threads."""
        return await self._db(fn, args, kwargs, first=False)

    async def db_first(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``db``, ahead of the work queued for the turns already driven (``dbpool``): a turn's
        first tick when the gateway takes it from the stream."""
        return await self._db(fn, args, kwargs, first=True)

    async def _db(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], *, first: bool) -> T:
        if self._executor is None:
            return _db_call(fn, args, kwargs)  # on the loop's thread (a test's), the connection handed back too
        self.db_waiting += 1
        try:
            return await asyncio.wrap_future(self._executor.submit(partial(_db_call, fn, args, kwargs), first=first))
        finally:
            self.db_waiting -= 1

    def _takes(self, free: int) -> tuple[int, int | None]:
        """How many new entries to read now, and how long to wait for them (ms; None: not at all).
        A gateway with a database thread idle waits on the stream; one whose threads are all at
        work reads, without waiting, its share of the entries nobody has read (``_share``), every
        ``BUSY_PAUSE_SECONDS``: their first ticks go ahead of its other database work
        (``db_first``), and a gateway waiting on the stream is handed a new entry first (Redis
        serves a blocked read at once). Before, a busy gateway read at most what its threads
        could start at once (twice their number, less its queue): in a burst of new sessions the
        entries waited on the stream, not in the gateways, ~2.9 s each (bench/concurrency.py
        N = 1,000, sessions created at 290 a second; their ticks took 10 ms)."""
        takes = max(0, min(free, READ_BATCH))
        if takes <= 0:
            return 0, None
        return takes, (1000 if self.db_waiting < self.db_threads else None)

    async def _room(self, client: aioredis.Redis) -> int:
        """How many new turns this gateway may take now: up to ``BALANCE_SLACK`` above the mean of
        the turns the reading gateways drive (each says its own here, before each read). A gateway
        drives every call of the turns it takes, so the split of a burst of new sessions is the
        split of the whole run's work: bench/concurrency.py N = 1,000 saw 59 % of the gateways' CPU
        in one of two, the other idle for the run's last two seconds while the first, at the
        core one process can use, finished its turns. Alone (or when Redis fails): no limit."""
        now = time.time()
        try:
            async with client.pipeline(transaction=False) as pipe:
                pipe.hset(LOAD_KEY, self.name, f"{self.in_flight} {now:.3f}")
                pipe.hgetall(LOAD_KEY)
                _, loads = await pipe.execute()
            others, stale = [], []
            for name, value in loads.items():
                turns, _, at = value.decode().partition(" ")
                if now - float(at) > 10 * LOAD_FRESH_SECONDS:
                    stale.append(name)
                elif name.decode() != self.name and now - float(at) <= LOAD_FRESH_SECONDS:
                    others.append(int(turns))
            if stale:  # gateways gone long ago
                async with client.pipeline(transaction=False) as pipe:
                    pipe.hdel(LOAD_KEY, *stale)
                    await pipe.execute()
        except (aioredis.RedisError, ValueError, UnicodeDecodeError):
            return READ_BATCH
        if not others:
            return READ_BATCH
        mean = (self.in_flight + sum(others)) / (1 + len(others))
        return max(0, int(mean + BALANCE_SLACK - self.in_flight))

    async def _share(self, client: aioredis.Redis, most: int) -> int:
        """A busy gateway's read of the entries nobody has read: its share of them (the unread
        entries over the gateways reading the stream), at most ``most``. Taking them all sent a
        burst of new sessions to whichever busy gateway looked first (bench/concurrency.py N = 300:
        197 of one gateway's 208 turns came in such reads, the other drove 92; with shares 144
        and 156), and the one that took most drove them slower, its commits and live updates with
        them. Acknowledged entries are deleted, so the stream holds what is pending or unread."""
        try:
            async with client.pipeline(transaction=False) as pipe:
                pipe.xlen(MODEL_STREAM)
                pipe.xpending(MODEL_STREAM, MODEL_GROUP)
                pipe.xinfo_consumers(MODEL_STREAM, MODEL_GROUP)
                length, pending, consumers = await pipe.execute()
            unread = int(length) - int(pending["pending"])
            readers = sum(1 for c in consumers if int(c["idle"]) < READER_IDLE_MS) or 1
        except (aioredis.RedisError, KeyError, TypeError, ValueError):
            return most
        return max(1, min(most, -(-unread // readers)))

    # --- driving a turn -----------------------------------------------------------------------

    async def turn_drive(self, turn_id: uuid.UUID | str, *, on_ticked: Callable[[], Awaitable[None]] | None = None,
                         session_id: uuid.UUID | None = None) -> None:
        """Tick the turn, run the model calls (and in-process tools) the ticks claim, until it waits
        or is handed to a Celery worker. ``on_ticked`` runs once the first tick has committed.
        ``session_id``: the turn's session, when the caller knows it (one query less)."""
        started = time.monotonic()
        deadline = started + settings.AGENTOPS_GATEWAY_DRIVE_SECONDS

        def fresh() -> bool:
            """Drive on? A turn goes back to the stream (and a Celery tick) at its next step once
            the gateway is stopping (the drain waits only for calls in flight), once its share
            of a full gateway is used (other turns wait for a slot), or after the drive's bound."""
            now = time.monotonic()
            return not self.stopping() and now <= deadline and (now - started <= INLINE_SECONDS or not self.full())

        # The first tick claims what it can (a turn handed back takes a step at each new drive).
        claimed, convo = await self.db_first(_tick_and_load, turn_id, fresh=not self.stopping(), session_id=session_id,
                                       deadline=deadline)
        if on_ticked is not None:
            await on_ticked()
        while claimed is not None:
            if claimed.step.kind == Step.Kind.MODEL:
                ticked = await self.model_steps_drive(claimed, deadline=deadline, fresh=fresh, convo=convo)
                convo = None
                if ticked is not None:  # the reply was recorded and the turn ticked with it
                    claimed = ticked.claimed
                    continue
            elif claimed.step.kind == Step.Kind.COMPACTION:
                await self.side_call_drive(claimed.step, compaction_request, compaction_record_atomic)
            elif claimed.step.kind == Step.Kind.VERIFICATION:
                await self.side_call_drive(claimed.step, verification_request, verification_record_atomic)
            else:
                await self.db(tool_step_execute, claimed.step, claimed.approval, claimed.session)
            claimed = await self.db(turn_tick, turn_id, calls_models=True, fresh=fresh(),
                                    session_id=claimed.session.id)

    async def model_steps_drive(self, claimed: Claimed, *, deadline: float, fresh: Callable[[], bool] = lambda: True,
                                convo: Conversation | None = None) -> Ticked | None:
        """Call the model for a claimed step and record the reply; while replies ask only for
        read-only tools, the next model step is claimed with the record and called at once. Returns
        the tick that followed the last record (None: the call failed or was let go; tick again).
        ``convo``: the step's conversation, when the tick's database call loaded it already."""
        assert self.clients is not None
        if convo is None:
            convo = await self.db(Conversation.load, claimed.step, deadline=deadline, known=claimed)
        bodies = llm.RequestBodies()
        current = claimed.step
        while True:
            self.held[current.id] = current.lease_owner
            try:
                try:
                    reply = await self._call(current, llm.call_model(
                        clients=self.clients, profile=convo.session.agent, messages=convo.messages,
                        tools=convo.tools, sink=self._sink(current), hold_delta=True, bodies=bodies))
                except llm.ModelCallFailed as exc:
                    await self.db(model_failure_record, current, exc)
                    return None
                if reply is None:
                    return None
                await self.prohibitions_check(convo, current, reply)
                following = await self.db(model_reply_apply, convo, current, reply, fresh=fresh())
            finally:
                self.held.pop(current.id, None)
            if isinstance(following, Ticked):
                return following
            current = following

    async def prohibitions_check(self, convo: Conversation, step: Step, reply: llm.ModelReply) -> None:
        """Judge the reply's calls that may go to a reviewer against the session's prohibitions
        (``prohibitions.py``); the verdicts ride on the reply into the tool steps."""
        assert self.clients is not None
        if not convo.session.prohibitions or not reply.tool_calls:
            # Nothing to judge, known without the database: no trip through the database threads,
            # whose queue the reply would otherwise wait in twice (here and for its record).
            return
        calls = await self.db(calls_to_check, convo.session, reply)
        if not calls:
            return
        prohibitions = list(convo.session.prohibitions)
        try:
            checked = await llm.call_model(clients=self.clients, profile=convo.session.agent,
                                           messages=prohibitions_request(convo.session, calls), tools=[],
                                           sink=self._sink(step))
        except llm.ModelCallFailed as exc:
            reply.checks = checks_unavailable(prohibitions, calls, exc.message)
            return
        reply.checks = checks_parse(checked.content, prohibitions, calls)
        reply.check_prompt_tokens, reply.check_completion_tokens = checked.prompt_tokens, checked.completion_tokens

    async def side_call_drive(self, step: Step, request: Callable[[Step], tuple[Any, list[dict[str, Any]]]],
                              record: Callable[[Step, llm.ModelReply], bool]) -> None:
        """Call the model for a claimed compaction or verification step and record what it says
        (no tools offered): ``request`` builds the call, ``record`` writes it (lease holder only)."""
        assert self.clients is not None
        session, messages = await self.db(request, step)
        self.held[step.id] = step.lease_owner
        try:
            try:
                reply = await self._call(step, llm.call_model(clients=self.clients, profile=session.agent,
                                                              messages=messages, tools=[], sink=self._sink(step)))
            except llm.ModelCallFailed as exc:
                await self.db(model_failure_record, step, exc)
                return
            if reply is not None:
                await self.db(record, step, reply)
        finally:
            self.held.pop(step.id, None)

    async def _call(self, step: Step, call: Awaitable[llm.ModelReply]) -> llm.ModelReply | None:
        """Await a held step's model call; None when the step was settled elsewhere meanwhile (its
        turn cancelled, its lease lost) and ``_watch_held`` let the call go: nothing to record, and
        neither the endpoint's connection nor this gateway's slot stays taken for a reply nobody
        reads. A cancellation of the gateway itself (its shutdown) goes on up."""
        task = asyncio.ensure_future(call)
        self.calls[step.id] = task
        try:
            return await task
        except asyncio.CancelledError:
            if step.id in self.dropped and not _cancelling(asyncio.current_task()):
                log.info("model gateway: let go of the call of step %s (settled elsewhere)", step.id)
                return None
            raise
        finally:
            self.calls.pop(step.id, None)
            self.dropped.discard(step.id)

    def _sink(self, step: Step) -> llm.EventSink:
        async def record(type_: str, payload: dict[str, Any]) -> None:
            await self.db(event_record, session_id=step.session_id, turn_id=step.turn_id, step_id=step.id,
                          type=type_, payload=payload)
        return record

    async def step_handle(self, step_id: str, *, on_ticked: Callable[[], Awaitable[None]] | None = None) -> None:
        """Handle one stream entry: drive the turn of a planned model step."""
        turn_id = await self.db_first(turn_id_of_step, step_id)
        if turn_id is None:  # the session was deleted meanwhile
            if on_ticked is not None:
                await on_ticked()
            return
        await self.turn_drive(turn_id, on_ticked=on_ticked)

    # --- the stream ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Consume the stream until ``stop()``; then let the calls in flight finish."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.clients = llm.ModelClients(self._clients_per_endpoint)
        client = aioredis.from_url(settings.REDIS_URL, max_connections=self.concurrency + 16)
        tasks: set[asyncio.Task[None]] = set()
        reclaim = asyncio.create_task(self._reclaim(client, tasks))
        # Kept through the drain: the calls still in flight keep their leases, and a cancelled
        # turn's call is let go rather than waited for.
        background = [asyncio.create_task(coro) for coro in (
            self._renew_leases(), self._watch_held(), self._heartbeat(client))]
        log.info("model gateway %s: %d calls at once", self.name, self.concurrency)
        try:
            await self._ensure_group(client)
            while not self._stopping.is_set():
                free = self.concurrency - len(tasks)
                if free <= 0:
                    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    continue
                takes, block = self._takes(free)
                if takes > 0:
                    takes = min(takes, await self._room(client))
                if takes <= 0:
                    await asyncio.sleep(BUSY_PAUSE_SECONDS)
                    continue
                if block is None:
                    takes = await self._share(client, takes)
                try:
                    batches = await client.xreadgroup(MODEL_GROUP, self.name, {MODEL_STREAM: ">"},
                                                      count=takes, block=block)
                    if block is None and not batches:
                        await asyncio.sleep(BUSY_PAUSE_SECONDS)
                except aioredis.RedisError as exc:
                    log.warning("model gateway: reading the stream failed (%s); retrying", exc)
                    if "NOGROUP" in str(exc):
                        # Redis came back empty (a restart without persistence): make the group
                        # again, from the stream's start, so the entries added since are served.
                        with contextlib.suppress(aioredis.RedisError):
                            await self._ensure_group(client)
                            continue
                    await asyncio.sleep(1.0)
                    continue
                for _stream, entries in batches or []:
                    for entry_id, fields in entries:
                        self._start(client, tasks, entry_id, fields)
        finally:
            reclaim.cancel()  # takes no new entry
            if tasks:
                await asyncio.wait(tasks, timeout=settings.AGENTOPS_GATEWAY_DRAIN_SECONDS)
            for task in [*tasks, *background]:
                task.cancel()
            await self.clients.close()
            with contextlib.suppress(aioredis.RedisError):
                await client.delete(HEARTBEAT_KEY + self.name)
                async with client.pipeline(transaction=False) as pipe:
                    pipe.hdel(LOAD_KEY, self.name)
                    await pipe.execute()
            await client.aclose()
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)

    def full(self) -> bool:
        """Every slot taken: entries wait on the stream for this gateway (or another)."""
        return self.in_flight >= self.concurrency

    def stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    def stop(self) -> None:
        """Stop reading; ``run`` returns once the calls in flight are done (or after the drain time)."""
        if self._stopping is not None:
            self._stopping.set()

    def stop_threadsafe(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.stop)

    async def _ensure_group(self, client: aioredis.Redis) -> None:
        try:
            # From the start of the stream: entries added before any gateway ran are served too
            # (acknowledged entries are deleted, so the stream holds only unfinished ones).
            await client.xgroup_create(MODEL_STREAM, MODEL_GROUP, id="0", mkstream=True)
        except aioredis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _start(self, client: aioredis.Redis, tasks: set[asyncio.Task[None]], entry_id: bytes,
               fields: dict[bytes, bytes]) -> None:
        task = asyncio.create_task(self._handle(client, entry_id, fields))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _handle(self, client: aioredis.Redis, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        acked = False

        async def ack() -> None:
            nonlocal acked
            if not acked:
                acked = True
                async with client.pipeline(transaction=False) as pipe:
                    pipe.xack(MODEL_STREAM, MODEL_GROUP, entry_id)
                    pipe.xdel(MODEL_STREAM, entry_id)
                    await pipe.execute()

        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            session_id = _uuid(fields.get(b"session_id"))
            if b"turn_id" in fields:  # a new turn, or a planned step whose turn the entry names
                await self.turn_drive(fields[b"turn_id"].decode(), on_ticked=ack, session_id=session_id)
            else:
                await self.step_handle(fields.get(b"step_id", b"").decode(), on_ticked=ack)
        except Exception:
            # Not acknowledged when it failed before its tick committed: another read claims it
            # again; after that, the step's lease and the sweeper take over.
            log.exception("model gateway: entry %s failed", entry_id)
        finally:
            self.in_flight -= 1

    async def _reclaim(self, client: aioredis.Redis, tasks: set[asyncio.Task[None]]) -> None:
        """Take over entries that a gateway read and never acknowledged (it died before its tick)."""
        while True:
            await asyncio.sleep(self.reclaim_after / 3)
            try:
                takes, _ = self._takes(self.concurrency - len(tasks))
                if takes <= 0:
                    continue
                _next, entries, *_ = await client.xautoclaim(MODEL_STREAM, MODEL_GROUP, self.name,
                                                             min_idle_time=int(self.reclaim_after * 1000),
                                                             start_id="0-0", count=takes)
                for entry_id, fields in entries:
                    if fields:  # a deleted entry comes back empty
                        log.warning("model gateway: taking over entry %s", entry_id)
                        self._start(client, tasks, entry_id, fields)
            except aioredis.RedisError as exc:
                log.warning("model gateway: reclaiming failed: %s", exc)

    async def _renew_leases(self) -> None:
        """Keep the leases of the steps this gateway drives (long calls, retries, 429 waits)."""
        period = max(float(settings.AGENTOPS_LEASE_SECONDS) / 3, 0.2)
        while True:
            await asyncio.sleep(period)
            held = dict(self.held)
            if held:
                try:
                    await self.db(step_leases_renew, step_ids=list(held), owners=set(held.values()),
                                  lease_seconds=llm.model_lease_seconds())
                except Exception:
                    log.exception("model gateway: renewing %d leases failed", len(held))

    async def _watch_held(self) -> None:
        """Let go of the calls whose steps were settled elsewhere (a cancelled turn or session, a
        lease the sweeper took back): every ``watch_seconds`` (``AGENTOPS_GATEWAY_WATCH_SECONDS``),
        one indexed query for all held steps."""
        while True:
            await asyncio.sleep(self.watch_seconds)
            held = {step_id: owner for step_id, owner in self.held.items() if step_id in self.calls}
            if not held:
                continue
            try:
                alive = await self.db(steps_still_held, held)
            except Exception:
                log.exception("model gateway: checking %d held steps failed", len(held))
                continue
            for step_id in held.keys() - alive:
                task = self.calls.get(step_id)
                if task is not None and not task.done():
                    self.dropped.add(step_id)
                    task.cancel()

    async def _heartbeat(self, client: aioredis.Redis) -> None:
        """Say that this gateway is alive (``/healthz`` and the operators read it)."""
        ttl = int(HEARTBEAT_SECONDS * 3)
        while True:
            try:
                state = {"name": self.name, "in_flight": self.in_flight, "concurrency": self.concurrency,
                         "peak_in_flight": self.peak_in_flight}
                await client.set(HEARTBEAT_KEY + self.name, json.dumps(state), ex=ttl)
            except aioredis.RedisError as exc:
                log.warning("model gateway: heartbeat failed: %s", exc)
            await asyncio.sleep(HEARTBEAT_SECONDS)


def _tick_and_load(turn_id: uuid.UUID | str, *, fresh: bool, session_id: uuid.UUID | None,
                   deadline: float) -> tuple[Claimed | None, Conversation | None]:
    """A new turn's first tick and, when it claims a model step, that step's conversation, in one
    database call. As two, a burst of new turns queued all their ticks on the database threads
    first, and every conversation load behind them: no new turn's first model call went out until
    the whole burst was ticked (bench/concurrency.py N = 300: first calls p50 7.0 s, p99 7.2 s after
    the start, all sessions created by 3.9 s)."""
    claimed = turn_tick(turn_id, calls_models=True, fresh=fresh, session_id=session_id)
    if claimed is None or claimed.step.kind != Step.Kind.MODEL:
        return claimed, None
    try:
        return claimed, Conversation.load(claimed.step, deadline=deadline, known=claimed)
    except Exception:  # read-only: read again after the entry is acknowledged (the tick committed)
        log.warning("model gateway: loading the conversation of step %s failed; reading it again",
                    claimed.step.id, exc_info=True)
        return claimed, None


async def turn_drive_once(turn_id: uuid.UUID | str, *, session_id: uuid.UUID | None = None, **kwargs: Any) -> None:
    """Drive one turn with a gateway that reads no stream (tests, benchmarks)."""
    gateway = Gateway(**kwargs)
    gateway.clients = llm.ModelClients(gateway._clients_per_endpoint)
    try:
        await gateway.turn_drive(turn_id, session_id=session_id)
    finally:
        await gateway.clients.close()
        if gateway._executor is not None:
            gateway._executor.shutdown(wait=True)


def run_in_thread(**kwargs: Any) -> tuple[Gateway, threading.Thread]:
    """A gateway on its own event loop in a thread (tests, benchmarks). Stop it with
    ``gateway.stop_threadsafe()`` and join the thread."""
    gateway = Gateway(**kwargs)
    started = threading.Event()

    def main() -> None:
        async def go() -> None:
            started.set()
            await gateway.run()
        asyncio.run(go())

    thread = threading.Thread(target=main, name="model-gateway", daemon=True)
    thread.start()
    started.wait(10)
    while gateway._stopping is None:
        time.sleep(0.01)
    return gateway, thread
