"""The one-statement record of a step's outcome: the guarded step transitions' fast path.

The model-step loop (``model_step.py``) writes a whole reply at once: the model step completed,
its read-only tool steps with their results, their events, the counters and the next model
step, claimed. On PostgreSQL that is one statement of data-modifying CTEs, one round trip
instead of one per event, counter and row; elsewhere the same rows in several statements.

It guards like the transition services: every ``StepChange`` is checked against the step's
``TRANSITIONS`` before any SQL is built and applies only while the step is still in its
``from_status`` (a conditional update, as a claim); every inserted step must be reachable from
``planned``. The session row is locked first (the lock order of ``sessions_app.locks``).
"""

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from agentops import jsontext
from agentops.domain import InvalidTransition, NotFound
from sessions_app import announce
from sessions_app.events import EVENTS_TABLE, SESSIONS_TABLE, SET_LAST_EVENT_AT, db_uuid, last_event_at_params
from sessions_app.models import Event, Step, Turn
from sessions_app.rows import rows_json

COUNTERS = ("model_calls", "tool_calls", "prompt_tokens", "completion_tokens")
# What the write returns: the counters and the budgets, so the caller can check the next step.
# ``pinned_revision`` and ``compact_requested``: an operator's edit or request changes what the write
# returns, so a worker that predicted the row hands the turn to a tick (fresh prompt, compaction).
SESSION_FIELDS = (*COUNTERS, "wall_seconds", "max_tool_calls", "max_model_calls", "max_tokens", "max_wall_seconds",
                  "pinned_revision", "compact_requested")
_TURNS = Turn._meta.db_table
_STEPS = Step._meta.db_table
_SET_COUNTERS = ", ".join(f"{name} = {name} + %s" for name in COUNTERS)
_RETURNING = ", ".join(SESSION_FIELDS)
_STEP_COLUMNS = ", ".join(connection.ops.quote_name(str(f.column)) for f in Step._meta.concrete_fields)
_STEP_COLUMNS_OF_R = ", ".join(f"r.{connection.ops.quote_name(str(f.column))}" for f in Step._meta.concrete_fields)

# (type, step_id, payload) of one event to append.
EventSpec = tuple[str, uuid.UUID | None, dict[str, Any]]


@dataclass(frozen=True)
class StepChange:
    """Move one step ``from_status`` → ``to`` with ``fields``; applied only while the step is still
    in ``from_status`` (someone else's move, a cancel say, wins)."""

    step_id: uuid.UUID
    from_status: str
    to: str
    fields: Mapping[str, Any]

    def __post_init__(self) -> None:
        Step(status=self.from_status).ensure_can_move_to(self.to)


@dataclass(frozen=True)
class TurnStart:
    """Move the outcome's turn ``from_status`` → running and stamp its first start (``started_at``
    is set once: a turn that ran before keeps its own); applied only while the turn is still in
    ``from_status``, else the outcome is refused (``InvalidTransition``) and the caller rolls back."""

    from_status: str

    def __post_init__(self) -> None:
        Turn(status=self.from_status).ensure_can_move_to(Turn.Status.RUNNING)


def _check_insert(step: Step) -> None:
    """A step is inserted in a status its state machine reaches from ``planned``: planned itself,
    claimed (running), or settled after running (a read-only call run before it was recorded)."""
    status = step.status
    if status == Step.Status.PLANNED or Step(status=Step.Status.PLANNED).can_move_to(status):
        return
    if status in Step.SETTLED and Step(status=Step.Status.RUNNING).can_move_to(status):
        return
    raise InvalidTransition(f"A step cannot be created {status!r}", details={"to": status})


def step_outcome_record(*, session_id: uuid.UUID, turn_id: uuid.UUID, events: Sequence[EventSpec],
                        step_changes: Sequence[StepChange] = (), step_inserts: Sequence[Step] = (),
                        workspace: str | None = None, turn_start: TurnStart | None = None,
                        **counters: int) -> dict[str, Any] | None:
    """Write one outcome of a turn: events, counter increments (``COUNTERS``), the turn's tokens,
    conditional step moves and new steps (and, given ``workspace``, the session's workspace path,
    first used by this outcome; given ``turn_start``, the turn's move to running). Call inside
    atomic(); events are announced after commit.

    Returns the session's ``SESSION_FIELDS`` after the write plus ``steps_changed``, how many step
    changes applied (fewer than asked: a step moved meanwhile; the caller rolls back). None: no
    such session.
    """
    for step in step_inserts:
        _check_insert(step)
    now = timezone.now()
    add = [int(counters.pop(name, 0)) for name in COUNTERS]
    if counters:
        raise TypeError(f"unknown counters {sorted(counters)}")
    dumped = [jsontext.dumps(payload) for _, _, payload in events]
    write = _write_postgres if connection.vendor == "postgresql" else _write_portable
    written = write(session_id, turn_id, now, add, events, dumped, step_changes, step_inserts, workspace, turn_start)
    if written is None:
        return None
    for step in step_inserts:  # saved: a later save() of one updates its row
        step._state.adding, step._state.db = False, connection.alias
    last_seq, values, changed = written
    first_seq = last_seq - len(events) + 1
    announced = [{"seq": first_seq + i, "type": type_, "session_id": str(session_id), "turn_id": str(turn_id),
                  "step_id": str(step_id) if step_id else None, "payload": jsontext.loads(text),
                  "created_at": now.isoformat()}
                 for i, ((type_, step_id, _), text) in enumerate(zip(events, dumped, strict=True))]
    transaction.on_commit(partial(announce.announce_committed, announced), robust=True)
    return {**dict(zip(SESSION_FIELDS, values, strict=True)), "steps_changed": changed}


# (last_seq, the SESSION_FIELDS after the write, how many step changes applied); None: no session.
_Written = tuple[int, tuple[Any, ...], int] | None


def _change_fields(change: StepChange) -> dict[str, Any]:
    return {**change.fields, "status": change.to}


def _set_workspace(workspace: str | None) -> tuple[str, list[Any]]:
    return (", workspace = %s", [workspace]) if workspace is not None else ("", [])


def _write_portable(session_id: uuid.UUID, turn_id: uuid.UUID, now: datetime, add: list[int],
                    events: Sequence[EventSpec], dumped: list[str], step_changes: Sequence[StepChange],
                    step_inserts: Sequence[Step], workspace: str | None,
                    turn_start: TurnStart | None = None) -> _Written:
    """The write in several statements (SQLite): the same rows, the same order of locks."""
    set_workspace, workspace_params = _set_workspace(workspace)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {SESSIONS_TABLE} SET last_seq = last_seq + %s, {SET_LAST_EVENT_AT}, "
                       f"{_SET_COUNTERS}{set_workspace} WHERE id = %s RETURNING last_seq, {_RETURNING}",
                       [len(events), *last_event_at_params(now), *add, *workspace_params, db_uuid(session_id)])
        row = cursor.fetchone()
    if row is None:
        return None
    turns = Turn.objects.filter(pk=turn_id, session_id=session_id)
    if not turns.update(prompt_tokens=F("prompt_tokens") + add[2], completion_tokens=F("completion_tokens") + add[3],
                        updated_at=now):
        raise NotFound(f"No turn {turn_id} in session {session_id}")
    if turn_start is not None:
        turns.filter(started_at__isnull=True).update(started_at=now)
        if not turns.filter(status=turn_start.from_status).update(status=Turn.Status.RUNNING):
            raise _turn_moved(turn_id, turn_start)
    changed = sum(Step.objects.filter(pk=change.step_id, status=change.from_status).update(
        **_change_fields(change), updated_at=now) for change in step_changes)
    Step.objects.bulk_create(step_inserts)
    first_seq = row[0] - len(events) + 1
    Event.objects.bulk_create([
        Event(session_id=session_id, seq=first_seq + i, type=type_, turn_id=turn_id, step_id=step_id,
              payload=payload, created_at=now)
        for i, (type_, step_id, payload) in enumerate(events)])
    return row[0], tuple(row[1:]), changed


def _write_postgres(session_id: uuid.UUID, turn_id: uuid.UUID, now: datetime, add: list[int],
                    events: Sequence[EventSpec], dumped: list[str], step_changes: Sequence[StepChange],
                    step_inserts: Sequence[Step], workspace: str | None,
                    turn_start: TurnStart | None = None) -> _Written:
    """The write in one statement of data-modifying CTEs. Every CTE after ``s`` reads ``s``, so the
    session row is locked before any other row. The events and the new steps travel as one JSON
    parameter each: the statement's text is the same for every outcome with the same step moves
    (prepared once per connection, ``DATABASE_PREPARE_THRESHOLD``) and its parameters few."""
    quote = connection.ops.quote_name
    events_json = "[" + ", ".join(
        f'{{"ord": {i}, "type": {jsontext.dumps(type_)}, '
        f'"step_id": {jsontext.dumps(str(step_id) if step_id else None)}, '
        f'"payload": {text}}}' for i, ((type_, step_id, _), text) in enumerate(zip(events, dumped, strict=True),
                                                                          start=1)) + "]"
    start_sets, start_params, start_guard, guard_params = "", [], "", []
    if turn_start is not None:  # the turn's first move, guarded as the conditional updates are
        start_sets = f", status = %s, started_at = COALESCE({_TURNS}.started_at, %s)"
        start_params = [Turn.Status.RUNNING.value, now]
        start_guard, guard_params = f" AND {_TURNS}.status = %s", [turn_start.from_status]
    # Each CTE with its parameters, in the order of the text.
    ctes: list[tuple[str, list[Any]]] = [
        (f"s AS (UPDATE {SESSIONS_TABLE} SET last_seq = last_seq + %s, {SET_LAST_EVENT_AT}, {_SET_COUNTERS}, "
         f"workspace = COALESCE(%s, workspace) WHERE id = %s RETURNING last_seq, {_RETURNING})",
         [len(events), *last_event_at_params(now), *add, workspace, session_id]),
        (f"t AS (UPDATE {_TURNS} SET prompt_tokens = {_TURNS}.prompt_tokens + %s, "
         f"completion_tokens = {_TURNS}.completion_tokens + %s, updated_at = %s{start_sets} FROM s "
         f"WHERE {_TURNS}.id = %s AND {_TURNS}.session_id = %s{start_guard} RETURNING {_TURNS}.id)",
         [add[2], add[3], now, *start_params, turn_id, session_id, *guard_params]),
        (f"e AS (INSERT INTO {EVENTS_TABLE} (session_id, seq, type, turn_id, step_id, payload, created_at) "
         f"SELECT %s::uuid, s.last_seq - %s::int + v.ord, v.type, t.id, v.step_id, v.payload, %s "
         f"FROM s, t, jsonb_to_recordset(%s::jsonb) AS v(ord int, type text, step_id uuid, payload jsonb))",
         [session_id, len(events), now, events_json]),
        (f"i AS (INSERT INTO {_STEPS} ({_STEP_COLUMNS}) SELECT {_STEP_COLUMNS_OF_R} FROM s, "
         f"jsonb_populate_recordset(NULL::{_STEPS}, %s::jsonb) AS r)", [rows_json(step_inserts)]),
    ]
    changed = []
    for k, change in enumerate(step_changes):
        sets, params = [], []
        for name, value in {**_change_fields(change), "updated_at": now}.items():
            field = Step._meta.get_field(name)
            sets.append(f"{quote(field.column)} = %s")  # type: ignore[union-attr,arg-type]
            params.append(field.get_db_prep_save(value, connection))  # type: ignore[union-attr]
        ctes.append((f"u{k} AS (UPDATE {_STEPS} SET {', '.join(sets)} FROM s "
                     f"WHERE {_STEPS}.id = %s AND {_STEPS}.status = %s RETURNING {_STEPS}.id)",
                     [*params, change.step_id, change.from_status]))
        changed.append(f"(SELECT count(*) FROM u{k})")
    sql = (f"WITH {', '.join(text for text, _ in ctes)} SELECT last_seq, {_RETURNING}, "
           f"(SELECT count(*) FROM t), {' + '.join(changed) or '0'} FROM s")
    with connection.cursor() as cursor:
        cursor.execute(sql, [p for _, params in ctes for p in params])
        row = cursor.fetchone()
    if row is None:
        return None
    *values, turns, changed_count = row[1:]
    if not turns:
        if turn_start is not None and Turn.objects.filter(pk=turn_id, session_id=session_id).exists():
            raise _turn_moved(turn_id, turn_start)
        raise NotFound(f"No turn {turn_id} in session {session_id}")
    return row[0], tuple(values), changed_count


def _turn_moved(turn_id: uuid.UUID, turn_start: TurnStart) -> InvalidTransition:
    return InvalidTransition(f"Turn {turn_id} is no longer {turn_start.from_status}",
                             details={"from": turn_start.from_status, "to": Turn.Status.RUNNING.value})
