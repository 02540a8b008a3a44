"""Every write to sessions, turns, steps, events and artifacts.

Transition services lock the row, return early when the row is already in the target
status, refuse illegal moves with ``InvalidTransition`` (409), and record an event in the
same transaction.
"""

import json
import uuid
from collections.abc import Mapping
from contextlib import nullcontext as _nullcontext
from functools import partial
from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from agentops.domain import Conflict, InvalidArguments, NotFound, joins_transaction
from sessions_app import announce
from sessions_app.models import AgentProfile, AgentSession, Artifact, Event, Step, Turn

M = TypeVar("M", AgentSession, Turn, Step)


class TurnActive(Conflict):
    """The session already has an active turn."""

    code = "turn_active"


# --- the event log -----------------------------------------------------------------------

def event_record(*, session_id: uuid.UUID | str, type: str, payload: Mapping[str, Any] | None = None,
                 turn_id: uuid.UUID | str | None = None, step_id: uuid.UUID | str | None = None) -> Event:
    """Append an event to the session's timeline and announce it after commit.

    Runs in the caller's transaction (or its own). The seq comes from one
    ``UPDATE … RETURNING`` on the session row: the row lock serialises concurrent writers,
    so seqs are gap-free and unique; a rolled-back caller rolls back its seq too.
    """
    now = timezone.now()
    data = dict(payload or {})
    with transaction.atomic() if not connection.in_atomic_block else _nullcontext():
        if connection.vendor == "postgresql":
            event = _event_insert_postgres(session_id, type, data, turn_id, step_id, now)
        else:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {_SESSIONS} SET last_seq = last_seq + 1, last_event_at = %s WHERE id = %s "
                    "RETURNING last_seq", [now, _db_uuid(session_id)])
                row = cursor.fetchone()
            if row is None:
                raise NotFound(f"No session {session_id}")
            event = Event.objects.create(session_id=session_id, seq=row[0], type=type, payload=data,
                                         turn_id=turn_id, step_id=step_id, created_at=now)
        transaction.on_commit(partial(announce.announce_later, event.as_dict()), robust=True)
    return event


_SESSIONS = AgentSession._meta.db_table
_EVENTS = Event._meta.db_table


def _event_insert_postgres(session_id: uuid.UUID | str, type: str, payload: dict[str, Any],
                           turn_id: uuid.UUID | str | None, step_id: uuid.UUID | str | None, now: Any) -> Event:
    """Allocate the seq and insert the event in one round trip (this runs ~4 times per engine step)."""
    sid = uuid.UUID(str(session_id))
    tid = uuid.UUID(str(turn_id)) if turn_id else None
    stid = uuid.UUID(str(step_id)) if step_id else None
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH s AS (UPDATE {_SESSIONS} SET last_seq = last_seq + 1, last_event_at = %s WHERE id = %s "
            f"RETURNING last_seq) INSERT INTO {_EVENTS} (session_id, seq, type, turn_id, step_id, payload, created_at) "
            "SELECT %s, s.last_seq, %s, %s, %s, %s::jsonb, %s FROM s RETURNING id, seq",
            [now, sid, sid, type, tid, stid, json.dumps(payload, cls=DjangoJSONEncoder), now])
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"No session {session_id}")
    event = Event(id=row[0], session_id=sid, seq=row[1], type=type, turn_id=tid, step_id=stid,
                  payload=json.loads(json.dumps(payload, cls=DjangoJSONEncoder)), created_at=now)
    event._state.adding = False
    return event


def session_lock_fetch(session_id: uuid.UUID | str) -> AgentSession | None:
    """Lock the session row and return it with its agent, in one query (see ``session_lock``)."""
    key = uuid.UUID(str(session_id))
    session = (AgentSession.objects.select_for_update(of=("self",)).select_related("agent")
               .filter(pk=key).first())
    _remember_lock(key)
    return session


def _remember_lock(key: uuid.UUID) -> None:
    outermost = connection.atomic_blocks[0] if connection.atomic_blocks else None
    if outermost is None:
        return
    held = getattr(connection, "_agentops_session_locks", None)
    if held is None or held[0] is not outermost:
        held = (outermost, set[uuid.UUID]())
        connection._agentops_session_locks = held  # type: ignore[attr-defined]
    held[1].add(key)


def session_lock(session_id: uuid.UUID | str) -> None:
    """Lock the session row. Call first in every write transaction of a session (inside atomic()).

    One lock order for everything (session → turn → step → approval) rules out deadlocks:
    event_record locks the session row anyway, so a transaction that locked a step first and
    then records an event would wait on a tick that holds the session and wants that step.
    A second call in the same transaction costs nothing (one round trip saved per write).
    """
    key = uuid.UUID(str(session_id))
    outermost = connection.atomic_blocks[0] if connection.atomic_blocks else None
    held = getattr(connection, "_agentops_session_locks", None)
    if outermost is not None and held is not None and held[0] is outermost and key in held[1]:
        return
    list(AgentSession.objects.select_for_update().filter(pk=key).values_list("pk", flat=True))
    _remember_lock(key)


def _db_uuid(value: uuid.UUID | str) -> str:
    # SQLite stores UUIDs as 32 hex chars, PostgreSQL as uuid; hex works for both.
    return uuid.UUID(str(value)).hex


# --- transitions -------------------------------------------------------------------------

def _transition(model: type[M], pk: Any, to: str, fields: Mapping[str, Any] | None = None,
                session_id: uuid.UUID | str | None = None, known: M | None = None) -> tuple[M, bool]:
    """Lock, check and move one row. Returns (row, changed). Call inside atomic().

    ``known`` is the row as the caller last read it: when its status still holds (a conditional
    update says so) the move costs one query; otherwise the row is re-read under the lock.
    """
    if known is not None and known.status != to and known.can_move_to(to):
        session_lock(known.session_id if model is not AgentSession else known.pk)  # type: ignore[attr-defined]
        now = timezone.now()
        changes = {"status": to, "updated_at": now, **(fields or {})}
        if model.objects.filter(pk=pk, status=known.status).update(**changes):
            for name, value in changes.items():
                setattr(known, name, value)
            return known, True
    try:
        if model is not AgentSession:
            if session_id is None:
                session_id = model.objects.values_list("session_id", flat=True).get(pk=pk)  # type: ignore[misc]
            session_lock(session_id)
        obj = model.objects.select_for_update().get(pk=pk)
    except model.DoesNotExist as exc:
        raise NotFound(f"No {model.__name__} {pk}") from exc
    if obj.status == to:
        return obj, False
    obj.ensure_can_move_to(to)
    obj.status = to
    update_fields = ["status", "updated_at"]
    for name, value in (fields or {}).items():
        setattr(obj, name, value)
        update_fields.append(name)
    obj.save(update_fields=update_fields)
    return obj, True


@joins_transaction
def session_transition(*, session_id: uuid.UUID | str, to: str) -> AgentSession:
    session, changed = _transition(AgentSession, session_id, to)
    if changed:
        event_record(session_id=session.id, type="session.status_changed", payload={"status": to})
    return session


@joins_transaction
def turn_transition(*, turn_id: uuid.UUID | str, to: str, session_id: uuid.UUID | str | None = None,
                    **fields: Any) -> Turn:
    """Move a turn; stamps started/finished times and records ``turn.<status>`` events."""
    now = timezone.now()
    if to == Turn.Status.RUNNING:
        fields.setdefault("started_at", now)
    if to in (Turn.Status.COMPLETED, Turn.Status.FAILED, Turn.Status.CANCELLED):
        fields.setdefault("finished_at", now)
    turn, changed = _transition(Turn, turn_id, to, fields, session_id=session_id)
    if changed:
        payload: dict[str, Any] = {"status": to, "index": turn.index}
        if turn.error_code:
            payload.update(error_code=turn.error_code, error_message=turn.error_message, retryable=turn.retryable)
        if to == Turn.Status.COMPLETED:
            payload["output_text"] = turn.output_text
        event_type = "turn.started" if to == Turn.Status.RUNNING else f"turn.{to}"
        event_record(session_id=turn.session_id, turn_id=turn.id, type=event_type, payload=payload)
    return turn


@joins_transaction
def step_transition(*, step_id: uuid.UUID | str, to: str, event_type: str | None = None,
                    event_payload: Mapping[str, Any] | None = None, session_id: uuid.UUID | str | None = None,
                    known: Step | None = None, **fields: Any) -> Step:
    """Move a step. ``event_type`` names the timeline event to record with the move."""
    now = timezone.now()
    if to == Step.Status.RUNNING:
        fields.setdefault("started_at", now)
    if to in Step.SETTLED:
        fields.setdefault("finished_at", now)
        fields.setdefault("lease_owner", "")
        fields.setdefault("lease_expires_at", None)
    step, changed = _transition(Step, step_id, to, fields, session_id=session_id, known=known)
    if changed and event_type:
        event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type=event_type,
                     payload={"status": to, "index": step.index, "kind": step.kind, "tool": step.tool_name,
                              **(event_payload or {})})
    return step


# --- sessions and turns ------------------------------------------------------------------

def _string_list(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise InvalidArguments(f"{name} must be a list of strings", details={"field": name})
    return list(value)


BUDGET_FIELDS = ("max_tool_calls", "max_model_calls", "max_tokens", "max_wall_seconds")


@transaction.atomic
def session_create(*, agent: AgentProfile, owner: User, title: str = "",
                   pinned: Mapping[str, Any] | None = None, budget: Mapping[str, Any] | None = None,
                   metadata: Mapping[str, Any] | None = None) -> AgentSession:
    """Create a session from an agent profile; budgets default to the profile's."""
    if not agent.enabled:
        raise InvalidArguments(f"Agent {agent.slug} is disabled", details={"field": "agent"})
    pinned = dict(pinned or {})
    unknown = set(pinned) - {"requirements", "prohibitions", "acceptance_criteria"}
    if unknown:
        raise InvalidArguments(f"Unknown pinned fields: {sorted(unknown)}", details={"fields": sorted(unknown)})
    budgets: dict[str, int | None] = {name: getattr(agent, name) for name in BUDGET_FIELDS}
    for name, value in (budget or {}).items():
        if name not in BUDGET_FIELDS:
            raise InvalidArguments(f"Unknown budget {name!r}", details={"field": name, "allowed": BUDGET_FIELDS})
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise InvalidArguments(f"Budget {name} must be a non-negative integer", details={"field": name})
        budgets[name] = value
    session = AgentSession.objects.create(
        agent=agent, owner=owner, title=title[:200],
        requirements=_string_list(pinned.get("requirements"), "requirements"),
        prohibitions=_string_list(pinned.get("prohibitions"), "prohibitions"),
        acceptance_criteria=_string_list(pinned.get("acceptance_criteria"), "acceptance_criteria"),
        metadata=dict(metadata or {}), **budgets,
    )
    event_record(session_id=session.id, type="session.created",
                 payload={"agent": agent.slug, "title": session.title, "owner": owner.get_username()})
    return session


@transaction.atomic
def turn_create(*, session_id: uuid.UUID | str, input: str, actor: User | None = None,
                idempotency_key: str = "") -> Turn:
    """Queue a new turn. Refuses with 409 ``turn_active`` while another turn is active.

    The caller enqueues the first engine tick after commit.
    """
    if not input or not input.strip():
        raise InvalidArguments("input must not be empty", details={"field": "input"})
    try:
        session = AgentSession.objects.select_for_update().get(pk=session_id)
    except AgentSession.DoesNotExist as exc:
        raise NotFound(f"No session {session_id}") from exc
    if idempotency_key:
        existing = Turn.objects.filter(session=session, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
    if Turn.objects.filter(session=session, status__in=Turn.ACTIVE).exists():
        raise TurnActive("This session already has an active turn; wait for it or cancel it.")
    index = (Turn.objects.filter(session=session).order_by("-index").values_list("index", flat=True).first() or 0) + 1
    try:
        with transaction.atomic():
            turn = Turn.objects.create(session=session, index=index, input=input, created_by=actor,
                                       idempotency_key=idempotency_key)
    except IntegrityError as exc:  # the partial unique index caught a racing turn
        raise TurnActive("This session already has an active turn.") from exc
    session_transition(session_id=session.id, to=AgentSession.Status.IN_PROGRESS)
    event_record(session_id=session.id, turn_id=turn.id, type="turn.queued",
                 payload={"index": index, "input": input})
    return turn


# --- artifacts ---------------------------------------------------------------------------

def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@joins_transaction
def artifact_record(*, session_id: uuid.UUID | str, path: str, size: int, sha256: str, storage_path: str,
                    content_type: str = "application/octet-stream", turn_id: uuid.UUID | str | None = None,
                    step_id: uuid.UUID | str | None = None) -> Artifact:
    artifact, created = Artifact.objects.get_or_create(
        session_id=uuid.UUID(str(session_id)), path=path, sha256=sha256,
        defaults={"size": size, "storage_path": storage_path, "content_type": content_type,
                  "turn_id": turn_id, "step_id": step_id},
    )
    if created:
        event_record(session_id=session_id, turn_id=turn_id, step_id=step_id, type="artifact.published",
                     payload={"artifact_id": str(artifact.id), "path": path, "size": size, "sha256": sha256})
    return artifact
