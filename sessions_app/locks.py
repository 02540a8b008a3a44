"""The session row lock: one lock order for every write of a session.

Every write transaction of a session locks the session row first, then the turn, step or
approval it changes. One order for everything (session → turn → step → approval) rules out
deadlocks: ``event_record`` locks the session row anyway, so a transaction that locked a step
first and then recorded an event would wait on a tick that holds the session and wants that step.
"""

import threading
import uuid
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model, QuerySet

from agentops.prepared import Prepared
from sessions_app.models import AgentSession

R = TypeVar("R", bound=Model)

# The sessions this thread's current outermost transaction has locked. Django's connection is
# per thread, so a thread-local keyed by the outermost atomic block is exactly "this transaction".
_held = threading.local()

# Every tick's first query, compiled once (agentops/prepared.py).
_LOCKED_WITH_AGENT = Prepared(lambda pk: AgentSession.objects.select_for_update(of=("self",))
                              .select_related("agent").filter(pk=pk))


def _held_locks() -> set[uuid.UUID] | None:
    """The set for the current transaction, or None outside one."""
    outermost = connection.atomic_blocks[0] if connection.atomic_blocks else None
    if outermost is None:
        return None
    if getattr(_held, "block", None) is not outermost:
        _held.block, _held.keys = outermost, set()
    keys: set[uuid.UUID] = _held.keys
    return keys


def session_lock(session_id: uuid.UUID | str) -> None:
    """Lock the session row. Call first in every write transaction of a session (inside atomic()).

    A second call in the same transaction costs nothing: the lock is held until it ends.
    """
    key = uuid.UUID(str(session_id))
    held = _held_locks()
    if held is not None and key in held:
        return
    list(AgentSession.objects.select_for_update().filter(pk=key).values_list("pk", flat=True))
    if held is not None:
        held.add(key)


def session_lock_fetch(session_id: uuid.UUID | str) -> AgentSession | None:
    """Lock the session row and return it with its agent, in one query (see ``session_lock``)."""
    key = uuid.UUID(str(session_id))
    session = _LOCKED_WITH_AGENT.first(pk=key)
    held = _held_locks()
    if held is not None:
        held.add(key)
    return session


def locked_with_session(queryset: "QuerySet[R]", **lookup: Any) -> R:
    """Lock the session that owns a row, then the row (the one lock order). Call inside atomic().

    Raises the model's DoesNotExist, or ValueError / ValidationError for a malformed key.
    """
    session_lock(queryset.values_list("session_id", flat=True).get(**lookup))
    return queryset.select_for_update().get(**lookup)
