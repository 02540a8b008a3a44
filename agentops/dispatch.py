"""The one way work is handed to a worker: by name, after commit.

Nothing below the interfaces imports a Celery task: the engine and the approvals send by name
(the routes in settings map each name to its queue), so no layer calls back into ``tasks.py``,
and nothing is enqueued for a write that then rolls back. Outside a transaction the send happens
at once (``on_commit`` runs immediately in autocommit mode).

Model calls go to the model gateway through a Redis stream with a consumer group: a gateway reads
an entry, claims the step in the database, then acknowledges it; an entry a dead gateway read but
never acknowledged is claimed again by another (XAUTOCLAIM). Delivery is at least once; the step's
claim in the database makes a second delivery do nothing.
"""

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any, cast

import redis
from django.conf import settings
from django.db import transaction
from kombu.exceptions import OperationalError

from agentops.celery import app

log = logging.getLogger(__name__)

TURN_ADVANCE = "sessions_app.tasks.turn_advance_task"
TOOL_RUN = "sessions_app.tasks.tool_run_task"
TURN_KICK = "sessions_app.tasks.turn_kick_task"
ENGINE_QUEUE = "engine"
KICK_MARKER = "agentops:kick:"
# A kick whose message was lost lets the turn be kicked again after this long.
KICK_MARKER_SECONDS = 600
MODEL_STREAM = "agentops:model-steps"
MODEL_GROUP = "gateways"

_redis: redis.Redis | None = None
_redis_lock = threading.Lock()


def redis_client() -> redis.Redis:
    """This process's Redis client for the model stream (one connection pool per process)."""
    global _redis
    with _redis_lock:
        if _redis is None:
            _redis = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5,
                                          health_check_interval=30)
        return _redis


def _on_commit(what: str, send: Callable[[], object]) -> None:
    def run() -> None:
        try:
            send()
        except (OperationalError, redis.RedisError, OSError):
            # The broker is down: the write is committed and the sweeper re-drives quiet turns.
            log.exception("could not hand over %s; the recovery sweeper will pick it up", what)

    transaction.on_commit(run)


def _send_tick(turn_id: uuid.UUID | str) -> None:
    if os.environ.get("AGENTOPS_FAILPOINT_DROP_TICKS"):
        # Fault injection for the tests of the sweeper: the wake-up is lost as in a Redis blip.
        raise redis.ConnectionError("failpoint: tick dropped")
    app.send_task(TURN_ADVANCE, args=[str(turn_id)])


def tick_enqueue(turn_id: uuid.UUID | str) -> None:
    """Wake the engine for a turn (Celery queue ``engine``)."""
    _on_commit(f"tick {turn_id}", lambda: _send_tick(turn_id))


def engine_backlog() -> int:
    """How much work waits: tasks in the engine queue (the Redis list kombu keeps for it) plus
    model-stream entries the gateways have not read or not acknowledged yet."""
    client = redis_client()
    waiting = cast(int, client.llen(ENGINE_QUEUE))
    try:
        groups = cast(list[dict[Any, Any]], client.xinfo_groups(MODEL_STREAM))
    except redis.ResponseError:  # no stream yet
        groups = []
    for group in groups:
        if group.get("name") in (MODEL_GROUP, MODEL_GROUP.encode()):
            waiting += int(group.get("lag") or 0) + int(group.get("pending") or 0)
    return waiting


def turn_kick_enqueue(turn_id: uuid.UUID | str) -> bool:
    """The sweeper's wake-up of a quiet turn: sent at once (call it outside a transaction), and
    not at all while an earlier kick of the turn is still queued (its marker is cleared by the
    task, ``turn_kick_taken``). Returns True when a kick was sent."""
    client = redis_client()
    key = f"{KICK_MARKER}{turn_id}"
    try:
        if not client.set(key, "1", nx=True, ex=KICK_MARKER_SECONDS):
            return False
        app.send_task(TURN_KICK, args=[str(turn_id)])
    except (OperationalError, redis.RedisError, OSError):
        log.exception("could not kick turn %s; the next sweep tries again", turn_id)
        with contextlib.suppress(redis.RedisError):
            client.delete(key)
        return False
    return True


def turn_kick_taken(turn_id: uuid.UUID | str) -> None:
    """A kick left the queue: the turn may be kicked again."""
    try:
        redis_client().delete(f"{KICK_MARKER}{turn_id}")
    except redis.RedisError:
        log.warning("could not clear the kick marker of turn %s; it expires by itself", turn_id)


def _no_host(step_id: str) -> str | None:
    return None


# The queue of the host a tool step's session is pinned to: ``sandbox.<host>``; "" when a runner
# fetches the step itself (nothing is sent); None: the shared ``sandbox`` queue (one machine).
# hosts_app sets it in AppConfig.ready().
tool_queue_for: Callable[[str], str | None] = _no_host


def tool_run_enqueue(step_id: uuid.UUID | str) -> None:
    """Hand an approved tool step to its session's sandbox host (Celery queue ``sandbox.<host>``,
    or ``sandbox`` with no hosts), or leave it for the session's runner to fetch."""
    def send() -> None:
        queue = tool_queue_for(str(step_id))
        if queue != "":
            app.send_task(TOOL_RUN, args=[str(step_id)], queue=queue)

    _on_commit(f"tool step {step_id}", send)


def host_task_enqueue(name: str, args: list[str], *, queue: str) -> None:
    """Send a task to one sandbox host's queue after commit (previews, manifest checks)."""
    _on_commit(f"{name} {args}", lambda: app.send_task(name, args=args, queue=queue))


def _entry(**ids: uuid.UUID | str | None) -> dict[str, str]:
    return {name: str(value) for name, value in ids.items() if value is not None}


def model_call_enqueue(step_id: uuid.UUID | str, *, turn_id: uuid.UUID | str | None = None,
                       session_id: uuid.UUID | str | None = None) -> None:
    """Hand a planned model step to the model gateway (the Redis stream ``MODEL_STREAM``). The
    step's turn and session, when given, ride along: the gateway then looks neither up."""
    entry = _entry(step_id=step_id, turn_id=turn_id, session_id=session_id)
    _on_commit(f"model step {step_id}", lambda: redis_client().xadd(MODEL_STREAM, entry))  # type: ignore[arg-type]


def turn_start_enqueue(turn_id: uuid.UUID | str, *, session_id: uuid.UUID | str | None = None) -> None:
    """Start a new turn on the model gateway: its first action is a model call, so the gateway
    ticks it itself (one hop less than a Celery tick that hands the call over)."""
    entry = _entry(turn_id=turn_id, session_id=session_id)
    _on_commit(f"turn {turn_id}", lambda: redis_client().xadd(MODEL_STREAM, entry))  # type: ignore[arg-type]
