"""The announcer process: renders and sends the events that writers relay to it.

Writers append each committed event that someone listens to (``announce.relay_push``: a
watcher's group has a member) to the ``RELAY_STREAM`` Redis stream while this process's
heartbeat key exists (``announce.relay_alive``); this loop reads the stream in order, renders
the fragments of a batch once and sends one message per group, as a writer's own announcer thread
would, in a process that does nothing else. The stream is read with plain ``XREAD``: announcing is
at-most-once anyway (clients re-read any gap in ``seq`` from the database), and one reader keeps
the commit order. The last id read is kept in Redis, so a restarted announcer goes on where the
last one stopped, at most ``RESUME_SECONDS`` back: older events are already stale for a live view
(clients re-read them on their next gap or reconnect).

With ``AGENTOPS_ANNOUNCERS`` = n > 1, n such processes share the sessions (``--shard k``): each
reads the stream, keeps the resume point and beats the heartbeat of its own shard
(``announce.shard_of``), so a burst of many sessions' events is rendered on several cores.
"""

import json
import logging
import threading
import time
from contextlib import suppress
from typing import Any

from django.db import close_old_connections, connection

from agentops.dispatch import redis_client
from sessions_app import announce

log = logging.getLogger(__name__)

LAST_ID_KEY = "agentops:announcer:last"
ALIVE_TTL_SECONDS = 5
HEARTBEAT_SECONDS = 1.0
BLOCK_MS = 1000
RESUME_SECONDS = 60


def last_id_key(shard: int = 0) -> str:
    return LAST_ID_KEY + (f":{shard}" if shard else "")


def _start_id(client: Any, shard: int = 0) -> str:
    """Where to read from: after the last id a previous announcer of the shard read, if it is
    recent; else the stream's end."""
    last = client.get(last_id_key(shard))
    if not last:
        return "$"
    last = _text(last)
    oldest = f"{int((time.time() - RESUME_SECONDS) * 1000)}-0"
    return last if _id_key(last) >= _id_key(oldest) else oldest


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _id_key(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def _decode(entries: list[tuple[Any, dict[Any, Any]]]) -> tuple[list[dict[str, Any]], list[float]]:
    events, committed = [], []
    for _, fields in entries:
        try:
            event = json.loads(fields[b"e"])
            at = float(fields.get(b"c", b"0"))
        except (KeyError, ValueError) as exc:
            log.warning("skipping a malformed relay entry: %s", exc)
            continue
        events.append(event)
        committed.append(at)
    return events, committed


def relay_run(stop: threading.Event, shard: int = 0) -> None:
    """Announce the events relayed to ``shard`` until ``stop`` is set; survives Redis and database
    outages."""
    stream, alive_key, resume_key = announce.relay_stream(shard), announce.relay_alive_key(shard), last_id_key(shard)
    last_id: str | None = None
    beat_at = 0.0
    while not stop.is_set():
        try:
            client = redis_client()
            if time.monotonic() - beat_at >= HEARTBEAT_SECONDS:
                client.set(alive_key, "1", ex=ALIVE_TTL_SECONDS)
                beat_at = time.monotonic()
            if last_id is None:
                last_id = _start_id(client, shard)
            got: Any = client.xread({stream: last_id}, count=announce.BATCH_LIMIT, block=BLOCK_MS)
        except Exception as exc:  # Redis down or restarting: writers announce by themselves meanwhile
            log.warning("announcer: reading the relay stream failed: %s", exc)
            last_id = None
            stop.wait(1.0)
            continue
        if not got:
            connection.close()  # idle: hold no database connection
            continue
        entries = got[0][1]
        last_id = _text(entries[-1][0])
        events, committed = _decode(entries)
        # Stored before the batch is sent: a SIGKILL between the two then loses at most this batch
        # (clients re-read a gap), where one after sending but before storing left no resume point
        # at all and the next announcer started from the stream's end, skipping what was relayed
        # while none ran.
        with suppress(Exception):  # else the next read fails the same way and restarts from the stored id
            client.set(resume_key, last_id)
        if events:
            close_old_connections()
            announce.announce_batch(events, committed=committed)
    with suppress(Exception):
        redis_client().delete(alive_key)  # writers announce by themselves from now on
