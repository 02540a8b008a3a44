"""Every write to sessions, turns, steps, events and artifacts.

Transition services lock the row, return early when the row is already in the target
status, refuse illegal moves with ``InvalidTransition`` (409), and record an event in the
same transaction.
"""

import json
import uuid
from collections.abc import Mapping, Sequence
from contextlib import nullcontext as _nullcontext
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Model, QuerySet
from django.db.models.sql import InsertQuery
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
                    f"UPDATE {_SESSIONS} SET last_seq = last_seq + 1, {_LAST_EVENT_AT} WHERE id = %s "
                    "RETURNING last_seq", [*_last_event_at(now), _db_uuid(session_id)])
                row = cursor.fetchone()
            if row is None:
                raise NotFound(f"No session {session_id}")
            event = Event.objects.create(session_id=session_id, seq=row[0], type=type, payload=data,
                                         turn_id=turn_id, step_id=step_id, created_at=now)
        transaction.on_commit(partial(announce.announce_later, event.as_dict()), robust=True)
    return event


_SESSIONS = AgentSession._meta.db_table
# last_event_at moves at most once a second: the session row is updated with every event, and an
# update that leaves every indexed column alone is a HOT update on PostgreSQL (no index writes).
_LAST_EVENT_AT = ("last_event_at = CASE WHEN last_event_at IS NULL OR last_event_at < %s THEN %s "
                  "ELSE last_event_at END")


def _last_event_at(now: Any) -> tuple[Any, Any]:
    return now - timedelta(seconds=1), now
_EVENTS = Event._meta.db_table
_STEPS = Step._meta.db_table


def _event_insert_postgres(session_id: uuid.UUID | str, type: str, payload: dict[str, Any],
                           turn_id: uuid.UUID | str | None, step_id: uuid.UUID | str | None, now: Any) -> Event:
    """Allocate the seq and insert the event in one round trip (this runs ~4 times per engine step)."""
    sid = uuid.UUID(str(session_id))
    tid = uuid.UUID(str(turn_id)) if turn_id else None
    stid = uuid.UUID(str(step_id)) if step_id else None
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH s AS (UPDATE {_SESSIONS} SET last_seq = last_seq + 1, {_LAST_EVENT_AT} WHERE id = %s "
            f"RETURNING last_seq) INSERT INTO {_EVENTS} (session_id, seq, type, turn_id, step_id, payload, created_at) "
            "SELECT %s, s.last_seq, %s, %s, %s, %s::jsonb, %s FROM s RETURNING id, seq",
            [*_last_event_at(now), sid, sid, type, tid, stid, json.dumps(payload, cls=DjangoJSONEncoder), now])
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"No session {session_id}")
    event = Event(id=row[0], session_id=sid, seq=row[1], type=type, turn_id=tid, step_id=stid,
                  payload=json.loads(json.dumps(payload, cls=DjangoJSONEncoder)), created_at=now)
    event._state.adding = False
    return event


COUNTERS = ("model_calls", "tool_calls", "prompt_tokens", "completion_tokens")
_TURNS = Turn._meta.db_table
SESSION_RECORD_FIELDS = (*COUNTERS, "wall_seconds", "max_tool_calls", "max_model_calls", "max_tokens",
                         "max_wall_seconds")


@dataclass(frozen=True)
class StepChange:
    """A conditional update of one step for ``session_record``: applied only while the step is
    still in ``from_status``."""

    step_id: uuid.UUID
    from_status: str
    fields: Mapping[str, Any]


def session_record(*, session_id: uuid.UUID, turn_id: uuid.UUID,
                   events: Sequence[tuple[str, uuid.UUID | None, dict[str, Any]]],
                   step_changes: Sequence[StepChange] = (), step_inserts: Sequence[Step] = (),
                   **counters: int) -> dict[str, Any] | None:
    """Write one outcome of a turn in one statement (on PostgreSQL): append its events, add to the
    session's counters and the turn's tokens, apply conditional step updates, insert new steps.

    Call inside atomic(). The session row is locked first (the lock order of ``session_lock``);
    the events are announced after commit. ``events`` are (type, step_id, payload), ``counters``
    increments of COUNTERS. Returns the session's counters and budgets after the write plus
    ``steps_changed``, the number of step changes that applied: fewer than asked means a step
    moved meanwhile (cancelled?) and the caller must roll back. None: no such session.
    The engine's inline path writes each step with this: one round trip instead of one per
    event, counter and row.
    """
    now = timezone.now()
    add = [int(counters.pop(name, 0)) for name in COUNTERS]
    if counters:
        raise TypeError(f"unknown counters {sorted(counters)}")
    dumped = [json.dumps(payload, cls=DjangoJSONEncoder) for _, _, payload in events]
    write = _session_record_postgres if connection.vendor == "postgresql" else _session_record_portable
    written = write(session_id, turn_id, now, add, events, dumped, step_changes, step_inserts)
    if written is None:
        return None
    last_seq, values, changed = written
    first_seq = last_seq - len(events) + 1
    for i, ((type_, step_id, _), text) in enumerate(zip(events, dumped, strict=True)):
        event = {"seq": first_seq + i, "type": type_, "session_id": str(session_id), "turn_id": str(turn_id),
                 "step_id": str(step_id) if step_id else None, "payload": json.loads(text),
                 "created_at": now.isoformat()}
        transaction.on_commit(partial(announce.announce_later, event), robust=True)
    return {**dict(zip(SESSION_RECORD_FIELDS, values, strict=True)), "steps_changed": changed}


# (last_seq, the SESSION_RECORD_FIELDS after the write, how many step changes applied); None: no session.
_Written = tuple[int, tuple[Any, ...], int] | None
_SET_COUNTERS = ", ".join(f"{name} = {name} + %s" for name in COUNTERS)
_RETURNING = ", ".join(SESSION_RECORD_FIELDS)


def _session_record_portable(session_id: uuid.UUID, turn_id: uuid.UUID, now: Any, add: list[int],
                             events: Sequence[tuple[str, uuid.UUID | None, dict[str, Any]]], dumped: list[str],
                             step_changes: Sequence[StepChange], step_inserts: Sequence[Step]) -> _Written:
    """``session_record`` in several statements (SQLite): the same rows, the same order of locks."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {_SESSIONS} SET last_seq = last_seq + %s, {_LAST_EVENT_AT}, {_SET_COUNTERS} "
                       f"WHERE id = %s RETURNING last_seq, {_RETURNING}",
                       [len(events), *_last_event_at(now), *add, _db_uuid(session_id)])
        row = cursor.fetchone()
    if row is None:
        return None
    if not Turn.objects.filter(pk=turn_id, session_id=session_id).update(
            prompt_tokens=F("prompt_tokens") + add[2], completion_tokens=F("completion_tokens") + add[3],
            updated_at=now):
        raise NotFound(f"No turn {turn_id} in session {session_id}")
    changed = sum(Step.objects.filter(pk=change.step_id, status=change.from_status).update(
        **change.fields, updated_at=now) for change in step_changes)
    Step.objects.bulk_create(step_inserts)
    first_seq = row[0] - len(events) + 1
    Event.objects.bulk_create([
        Event(session_id=session_id, seq=first_seq + i, type=type_, turn_id=turn_id, step_id=step_id,
              payload=payload, created_at=now)
        for i, (type_, step_id, payload) in enumerate(events)])
    return row[0], tuple(row[1:]), changed


def _session_record_postgres(session_id: uuid.UUID, turn_id: uuid.UUID, now: Any, add: list[int],
                             events: Sequence[tuple[str, uuid.UUID | None, dict[str, Any]]], dumped: list[str],
                             step_changes: Sequence[StepChange], step_inserts: Sequence[Step]) -> _Written:
    """``session_record`` in one statement of data-modifying CTEs."""
    n, steps, quote = len(events), _STEPS, connection.ops.quote_name
    # Each CTE with its parameters, in the order of the text. Every CTE after s reads s, so the
    # session row is locked before any other row.
    ctes: list[tuple[str, list[Any]]] = [
        (f"s AS (UPDATE {_SESSIONS} SET last_seq = last_seq + %s, {_LAST_EVENT_AT}, {_SET_COUNTERS} "
         f"WHERE id = %s RETURNING last_seq, {_RETURNING})", [n, *_last_event_at(now), *add, session_id]),
        (f"t AS (UPDATE {_TURNS} SET prompt_tokens = {_TURNS}.prompt_tokens + %s, "
         f"completion_tokens = {_TURNS}.completion_tokens + %s, updated_at = %s FROM s "
         f"WHERE {_TURNS}.id = %s AND {_TURNS}.session_id = %s RETURNING {_TURNS}.id)",
         [add[2], add[3], now, turn_id, session_id]),
    ]
    if events:
        values = ", ".join(["(%s::int, %s::text, %s::uuid, %s::jsonb)"] * n)
        params: list[Any] = [now, session_id]
        for i, ((type_, step_id, _), text) in enumerate(zip(events, dumped, strict=True), start=1):
            params += [i, type_, step_id, text]
        ctes.append((f"e AS (INSERT INTO {_EVENTS} (session_id, seq, type, turn_id, step_id, payload, created_at) "
                     f"SELECT sid.v, s.last_seq - {n} + v.ord, v.type, t.id, v.step_id, v.payload, %s "
                     f"FROM s, t, (SELECT %s::uuid AS v) AS sid, "
                     f"(VALUES {values}) AS v(ord, type, step_id, payload))", params))
    changed = []
    for k, change in enumerate(step_changes):
        sets, params = [], []
        for name, value in {**change.fields, "updated_at": now}.items():
            field = Step._meta.get_field(name)
            sets.append(f"{quote(field.column)} = %s")  # type: ignore[union-attr,arg-type]
            params.append(field.get_db_prep_save(value, connection))  # type: ignore[union-attr]
        ctes.append((f"u{k} AS (UPDATE {steps} SET {', '.join(sets)} FROM s "
                     f"WHERE {steps}.id = %s AND {steps}.status = %s RETURNING {steps}.id)",
                     [*params, change.step_id, change.from_status]))
        changed.append(f"(SELECT count(*) FROM u{k})")
    if step_inserts:
        query = InsertQuery(Step)
        query.insert_values(Step._meta.concrete_fields, list(step_inserts))
        ((insert_sql, insert_params),) = query.get_compiler(connection=connection).as_sql()
        ctes.append((f"i AS ({insert_sql})", list(insert_params)))
    sql = (f"WITH {', '.join(text for text, _ in ctes)} SELECT last_seq, {_RETURNING}, "
           f"(SELECT count(*) FROM t), {' + '.join(changed) or '0'} FROM s")
    with connection.cursor() as cursor:
        cursor.execute(sql, [p for _, params in ctes for p in params])
        row = cursor.fetchone()
    if row is None:
        return None
    *values, turns, changed_count = row[1:]
    if not turns:
        raise NotFound(f"No turn {turn_id} in session {session_id}")
    return row[0], tuple(values), changed_count


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


R = TypeVar("R", bound=Model)


def locked_with_session(queryset: "QuerySet[R]", **lookup: Any) -> R:
    """Lock the session that owns a row, then the row (the one lock order). Call inside atomic().

    Raises the model's DoesNotExist, or ValueError / ValidationError for a malformed key.
    """
    session_lock(queryset.values_list("session_id", flat=True).get(**lookup))
    return queryset.select_for_update().get(**lookup)


def _db_uuid(value: uuid.UUID | str) -> str:
    # SQLite stores UUIDs as 32 hex chars, PostgreSQL as uuid; hex works for both.
    return uuid.UUID(str(value)).hex


# --- transitions -------------------------------------------------------------------------

def _transition(model: type[M], pk: Any, to: str, fields: Mapping[str, Any] | None = None,
                session_id: uuid.UUID | str | None = None, known: M | None = None,
                set_once: tuple[str, ...] = ()) -> tuple[M, bool]:
    """Lock, check and move one row. Returns (row, changed). Call inside atomic().

    ``known`` is the row as the caller last read it: when its status still holds (a conditional
    update says so) the move costs one query; otherwise the row is re-read under the lock.
    Fields named in ``set_once`` are written only while the row has none.
    """
    if known is not None and known.status != to and known.can_move_to(to) and not set_once:
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
        if name in set_once and getattr(obj, name) is not None:
            continue
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
    """Move a turn; stamps started/finished times and records ``turn.<status>`` events.

    ``started_at`` is the first start: a turn resumed after an approval keeps it, so its wall
    time (and the wall-clock budget) counts from when it began, waits included."""
    now = timezone.now()
    if to == Turn.Status.RUNNING:
        fields.setdefault("started_at", now)
    if to in (Turn.Status.COMPLETED, Turn.Status.FAILED, Turn.Status.CANCELLED):
        fields.setdefault("finished_at", now)
    turn, changed = _transition(Turn, turn_id, to, fields, session_id=session_id, set_once=("started_at",))
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
