"""Announce stored events on the channel layer, after commit, without ever slowing or failing
the write.

``event_record`` hands each committed event to ``announce_later``; one daemon thread per process
renders the dashboard fragments (in bulk when events queue up) and sends them, in commit order,
through one persistent event loop: ``async_to_sync(group_send)`` would build a loop and a Redis
connection per call (≈ 4 ms), and rendering in the writer's thread put template work on every
engine step. What queued up is sent as one message per group (``event.batch`` when a group has
several events; consumers forward each), every group at once. The channel layer is at-most-once
anyway: clients re-read any gap in ``seq`` from the database, so an announcement lost to a full
queue, a dead Redis or an exiting process costs nothing but a re-read.
"""

import asyncio
import logging
import queue
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import close_old_connections, connection

from agentops import jsontext

log = logging.getLogger(__name__)

ANNOUNCE_TIMEOUT_SECONDS = 2.0
QUEUE_LIMIT = 10_000
BATCH_LIMIT = 200
LISTENED_TTL_SECONDS = 2.0
LISTENED_CACHE_LIMIT = 50_000

# Renders the HTML fragments of events for the dashboard, set by SessionsAppConfig.ready();
# None renders nothing (the payload alone is announced).
fragments_renderer: Callable[[list[dict[str, Any]]], list[str]] | None = None

_loop: asyncio.AbstractEventLoop | None = None
_pending: "queue.Queue[tuple[float, dict[str, Any]]]" = queue.Queue(maxsize=QUEUE_LIMIT)  # (committed at, event)
_worker: threading.Thread | None = None
_lock = threading.Lock()
# Group → until when (time.monotonic) it counts as listened without asking Redis (``_send``);
# written by the announcer's loop only (``_listened``).
_listened_until: dict[str, float] = {}


def session_group(session_id: object) -> str:
    return f"session.{session_id}"


def approvals_group(team_id: object) -> str:
    """The reviewers' queue of one team: a reviewer's socket joins the groups of their teams only."""
    return f"approvals.team.{team_id}"


def _get_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="event-announcer-loop", daemon=True).start()
            _loop = loop
        return _loop


async def _send_all(messages: list[tuple[str, dict[str, Any]]], stages: dict[int, list[float]] | None = None
                    ) -> None:
    """Every group's message at once: with our layer (``agentops.channel_layer``) two Redis round
    trips for the whole batch, else one ``group_send`` per group (four round trips each), all
    concurrently. A group gets one message per batch (``_messages``), so its events stay in commit
    order."""
    layer = get_channel_layer()
    if layer is None:
        return
    now = time.time()
    for _, message in messages:  # when it left (clients can tell the sender's delay from the rest)
        for item in unbatch(message):
            item["announced_at"] = now
            if stages is not None:  # AGENTOPS_PUSH_TIMINGS: [committed, picked, listened, rendered]
                item["stages"] = stages.get(id(item["event"]), [])
    send_many = getattr(layer, "group_send_many", None)
    if send_many is not None:
        await send_many(messages)
    else:  # another layer (the in-memory one)
        await asyncio.gather(*(layer.group_send(group, message) for group, message in messages))


def _render(events: list[dict[str, Any]]) -> list[str]:
    if fragments_renderer is None:
        return [""] * len(events)
    try:
        return fragments_renderer(events)
    except Exception:
        log.exception("rendering the fragments of %d events failed", len(events))
        return [""] * len(events)


def _messages(events: list[dict[str, Any]], htmls: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """One layer message per group: ``event.message`` for a single event, else ``event.batch``
    with the group's events in commit order (one message in Redis and in every consumer's queue
    instead of one per event: a burst of a session's tool events costs one delivery)."""
    items: dict[str, list[dict[str, Any]]] = {}
    for event, html in zip(events, htmls, strict=True):
        for group in _groups_of(event):
            items.setdefault(group, []).append({"event": event, "html": html})
    return [(group, {"type": "event.message", **got[0]} if len(got) == 1 else {"type": "event.batch", "items": got})
            for group, got in items.items()]


def unbatch(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a layer message (``event.message`` or ``event.batch``), each ``{"event",
    "html"}``, in seq order: what consumers forward, one by one."""
    if message.get("type") == "event.batch":
        items: list[dict[str, Any]] = message["items"]
        return items
    return [message]


def _groups_of(event: dict[str, Any]) -> list[str]:
    groups = [session_group(event["session_id"])]
    team_id = (event.get("payload") or {}).get("team_id")
    if str(event["type"]).startswith("approval.") and team_id is not None:
        groups.append(approvals_group(team_id))
    return groups


async def _listened(groups: set[str]) -> set[str]:
    """The groups someone listens to. Rendering and sending for nobody is pure cost (measured: the
    fragments were a third of the engine's CPU per step); a client that connects later reads the
    backlog from the database. Uses channels_redis's group keys, one pipelined round trip per
    Redis host; on any doubt, every group. Those found listened are remembered
    (``_listened_until``)."""
    layer = get_channel_layer()
    clock = time.monotonic()
    try:
        now = int(time.time())
        by_host: dict[int, list[str]] = {}
        for group in groups:
            by_host.setdefault(layer.consistent_hash(group), []).append(group)
        listened: set[str] = set()
        for index, names in by_host.items():
            pipe = layer.connection(index).pipeline(transaction=False)
            for group in names:
                pipe.zcount(layer._group_key(group), now - layer.group_expiry, "+inf")
            counts = await pipe.execute()
            listened.update(group for group, count in zip(names, counts, strict=True) if count)
        if len(_listened_until) > LISTENED_CACHE_LIMIT:
            _listened_until.clear()
        _listened_until.update(dict.fromkeys(listened, clock + LISTENED_TTL_SECONDS))
        return listened
    except Exception:
        return groups


def _send(events: list[dict[str, Any]], *, only_listened: bool = False,
          committed: list[float] | None = None) -> bool:
    loop = _get_loop()
    picked = time.time()
    try:
        if only_listened:
            # A group found listened counts as listened for LISTENED_TTL_SECONDS without asking
            # Redis or hopping to the loop thread (sending to a group its last client just left costs
            # one send); one found empty is asked again each time, so a client that subscribes
            # misses nothing. (The check was 2 ms of each announcement's p50 in the load proof.)
            clock = time.monotonic()
            groups = {g for e in events for g in _groups_of(e)}
            listened = {g for g in groups if _listened_until.get(g, 0.0) > clock}
            if groups - listened:
                listened |= asyncio.run_coroutine_threadsafe(_listened(groups - listened), loop).result(
                    ANNOUNCE_TIMEOUT_SECONDS)
            kept = [n for n, e in enumerate(events) if any(g in listened for g in _groups_of(e))]
            events = [events[n] for n in kept]
            committed = [committed[n] for n in kept] if committed is not None else None
            if not events:
                return True
    except Exception as exc:
        log.warning("checking listeners failed: %s", exc)
        return False
    checked = time.time()
    htmls = _render(events)
    stages = None
    if getattr(settings, "AGENTOPS_PUSH_TIMINGS", False):  # where an announcement's time goes (proof/load.py)
        rendered = time.time()
        stages = {id(e): [committed[n] if committed else picked, picked, checked, rendered]
                  for n, e in enumerate(events)}
    future = asyncio.run_coroutine_threadsafe(_send_all(_messages(events, htmls), stages), loop)
    try:
        future.result(timeout=ANNOUNCE_TIMEOUT_SECONDS)
        return True
    except Exception as exc:  # Redis down or slow: the events are stored; clients re-read by seq
        future.cancel()
        log.warning("announcing %d events (first %s/%s) failed: %s", len(events), events[0].get("session_id"),
                    events[0].get("seq"), exc)
        return False


def announce_batch(events: list[dict[str, Any]], *, committed: list[float]) -> bool:
    """Render and send committed events (in commit order) to the groups someone listens to: what
    the announcer thread does with what queued up, and the announcer process with what writers
    relayed. Never raises; False when they could not be sent."""
    return _send(events, only_listened=True, committed=committed)


def announce_event(event: dict[str, Any]) -> bool:
    """Render and send one stored event now. Never raises; False when it could not be sent."""
    return _send([event])


def _run() -> None:
    while True:
        try:
            first = _pending.get(timeout=1.0)
        except queue.Empty:
            connection.close()  # idle: do not hold a database connection (nor block a test DB drop)
            first = _pending.get()
        batch = [first]
        while len(batch) < BATCH_LIMIT:
            try:
                batch.append(_pending.get_nowait())
            except queue.Empty:
                break
        batch = relay_push(batch)  # what no announcer process takes is announced here
        if not batch:
            continue
        close_old_connections()
        _send([event for _, event in batch], only_listened=True, committed=[at for at, _ in batch])


# --- the relay: announcer processes of their own ----------------------------------------------
# A writer whose process is busy (a model gateway driving hundreds of calls, an engine worker)
# renders slowly: its announcer thread waits for the GIL between every query and every send
# (measured in the gateway at 300 sessions: picked p99 574 ms, rendered p99 408 ms). When an
# announcer process (``manage.py announcer``, ``relay.py``) is alive, writers only append their
# committed events to a Redis stream, one pipelined round trip per batch, and it renders and sends
# them. With AGENTOPS_ANNOUNCERS > 1 the sessions are split between that many announcers (a
# session's shard is a hash of its id, so its events keep their order), each with a stream and a
# heartbeat of its own. For a shard with none alive (its heartbeat key expired) the writers
# announce by themselves, as above.

RELAY_STREAM = "agentops:announce"
RELAY_ALIVE_KEY = "agentops:announcer:alive"
RELAY_MAXLEN = 100_000
RELAY_CHECK_SECONDS = 1.0
_relay_state: dict[str, Any] = {"alive": frozenset(), "checked_at": -1e9}


def relay_shards() -> int:
    return max(1, int(settings.AGENTOPS_ANNOUNCERS))


def shard_of(session_id: object, shards: int | None = None) -> int:
    """The announcer shard of a session: the same in every process (crc32, not ``hash()``)."""
    count = relay_shards() if shards is None else shards
    return zlib.crc32(str(session_id).encode()) % count if count > 1 else 0


def _suffix(shard: int) -> str:
    return f":{shard}" if shard else ""  # shard 0 keeps the names of a single announcer


def relay_stream(shard: int = 0) -> str:
    return RELAY_STREAM + _suffix(shard)


def relay_alive_key(shard: int = 0) -> str:
    return RELAY_ALIVE_KEY + _suffix(shard)


def relay_alive() -> frozenset[int]:
    """The shards whose announcer is alive (its heartbeat key exists). Asked of Redis at most once a
    second per process, one round trip; none when the relay is off (``AGENTOPS_ANNOUNCE_RELAY``)
    or Redis fails."""
    if not settings.AGENTOPS_ANNOUNCE_RELAY:
        return frozenset()
    now = time.monotonic()
    if now - _relay_state["checked_at"] >= RELAY_CHECK_SECONDS:
        from agentops.dispatch import redis_client

        shards = range(relay_shards())
        try:
            pipe = redis_client().pipeline(transaction=False)
            for shard in shards:
                pipe.exists(relay_alive_key(shard))
            _relay_state["alive"] = frozenset(s for s, found in zip(shards, pipe.execute(), strict=True) if found)
        except Exception:  # Redis down: announce here (which fails too, and costs only a re-read)
            _relay_state["alive"] = frozenset()
        _relay_state["checked_at"] = now
    alive: frozenset[int] = _relay_state["alive"]
    return alive


# Appends the events whose groups someone is in, in one script run: a group's members are read
# in the same Redis that holds the stream, after the commit, so a watcher is either in the group
# already (its event is relayed) or joins later and reads the event from its backlog (every
# consumer joins before it reads). KEYS: the groups' and the streams' keys; ARGV: the members'
# oldest join time kept, the streams' MAXLEN, then per event its stream's key index, its groups'
# key indexes (comma-separated), the event and its commit time.
RELAY_LISTENED_SCRIPT = """
local after, maxlen, heard, sent = ARGV[1], ARGV[2], {}, 0
for i = 3, #ARGV, 4 do
  local listened = false
  for g in string.gmatch(ARGV[i + 1], '%d+') do
    local k = tonumber(g)
    if heard[k] == nil then heard[k] = redis.call('ZCOUNT', KEYS[k], after, '+inf') > 0 end
    listened = listened or heard[k]
  end
  if listened then
    redis.call('XADD', KEYS[tonumber(ARGV[i])], 'MAXLEN', '~', maxlen, '*', 'e', ARGV[i + 2], 'c', ARGV[i + 3])
    sent = sent + 1
  end
end
return sent
"""


_relay_script: dict[int, Any] = {}  # the process's Redis client → the script registered on it


def _layer_on_relay_redis() -> Any:
    """The channel layer when its groups live in the Redis of the relay streams (one host, the
    same URL: the default and the README's layouts), so one script can read both; else None."""
    layer = get_channel_layer()
    hosts = getattr(layer, "hosts", None)
    if layer is None or not hasattr(layer, "_group_key") or not hosts or len(hosts) != 1:
        return None
    return layer if hosts[0].get("address") == settings.REDIS_URL else None


def _append(relayed: list[tuple[int, tuple[float, dict[str, Any]]]]) -> int:
    """Append the events to their shards' streams, one round trip, and say how many were."""
    from agentops.dispatch import redis_client

    client = redis_client()
    layer = _layer_on_relay_redis()
    if layer is None:  # groups elsewhere: relay everything, the announcer asks who listens
        pipe = client.pipeline(transaction=False)
        for shard, (committed, event) in relayed:
            pipe.xadd(relay_stream(shard), {"e": jsontext.dumps(event), "c": repr(committed)}, maxlen=RELAY_MAXLEN,
                      approximate=True)
        pipe.execute()
        return len(relayed)
    keys: dict[str | bytes, int] = {}

    def key(name: str | bytes) -> int:
        return keys.setdefault(name, len(keys) + 1)  # Lua counts from 1

    items: list[Any] = []
    for shard, (committed, event) in relayed:
        groups = ",".join(str(key(layer._group_key(group))) for group in _groups_of(event))
        items += [key(relay_stream(shard)), groups, jsontext.dumps(event), repr(committed)]
    script = _relay_script.get(id(client))
    if script is None:
        script = _relay_script[id(client)] = client.register_script(RELAY_LISTENED_SCRIPT)  # EVALSHA
    return int(script(keys=list(keys), args=[int(time.time()) - layer.group_expiry, RELAY_MAXLEN, *items]))


def relay_push(batch: list[tuple[float, dict[str, Any]]]) -> list[tuple[float, dict[str, Any]]]:
    """Hand committed events to their shards' announcer processes, in commit order, one round
    trip: only the events someone listens to (``RELAY_LISTENED_SCRIPT``; a session nobody watches
    costs its writer one script run and no announcer any work). Returns those it did not take
    (their shard has no announcer alive, or Redis refused: then all of them), which the caller
    announces itself."""
    alive = relay_alive()
    if not alive:
        return batch
    shards = relay_shards()
    relayed: list[tuple[int, tuple[float, dict[str, Any]]]] = []
    rest: list[tuple[float, dict[str, Any]]] = []
    for item in batch:
        shard = shard_of(item[1].get("session_id"), shards)
        if shard in alive:
            relayed.append((shard, item))
        else:
            rest.append(item)
    if not relayed:
        return batch
    try:
        _append(relayed)
    except Exception as exc:
        _relay_state["checked_at"] = -1e9  # ask again next time
        log.warning("relaying %d events failed, announcing them here: %s", len(batch), exc)
        return batch
    return rest


def announce_committed(events: list[dict[str, Any]]) -> None:
    """Hand on the events a transaction committed (an on_commit callback, in commit order): to the
    announcer processes' streams from the committing thread itself while they are alive, one
    pipelined round trip; the rest to this process's announcer thread (``announce_later``). Never
    raises.

    Why not always the thread: in a busy writer (the gateway, an engine worker, both at a lower CPU
    priority) the thread waited for the GIL and the CPU behind the writer it was meant to spare. In
    the load proof's push part, commit → picked by the announcer process was p50 5.3 / p99 55 ms
    for batches that found the announcer idle, most of an announcement's p99."""
    committed = time.time()
    batch = [(committed, event) for event in events]
    for at, event in relay_push(batch):
        announce_later(event, at)


def announce_later(event: dict[str, Any], committed: float | None = None) -> None:
    """Queue a committed event for the announcer thread (an on_commit callback). Never blocks."""
    global _worker
    with _lock:
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_run, name="event-announcer", daemon=True)
            _worker.start()
    try:
        _pending.put_nowait((time.time() if committed is None else committed, event))
    except queue.Full:
        log.warning("announcement queue full: event %s/%s left to gap replay", event.get("session_id"),
                    event.get("seq"))

