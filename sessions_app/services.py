"""Every write to sessions, turns, steps and artifacts: the guarded transitions and the domain services.

A transition locks the session row (the one lock order, ``sessions_app.locks``), returns early
when the row is already in the target status, refuses an illegal move with ``InvalidTransition``
(409) and records its event in the same transaction. Claims are transitions too: a conditional
update that only one caller wins, checked against the step's ``TRANSITIONS`` first.

Kept together (~600 lines) because every writer here takes the one lock order and the guarded
transition; the integrations' agent profiles live apart in ``sessions_app.agent_profiles``.
"""

import os
import socket
import threading
import uuid
from collections.abc import Mapping
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from agentops import jsontext
from agentops.domain import Conflict, DomainError, InvalidArguments, InvalidTransition, NotFound, joins_transaction
from agentops.permissions import OPERATE_SESSIONS, require_perm
from sessions_app import announce, hooks
from sessions_app.events import (
    EVENTS_TABLE,
    SET_LAST_EVENT_AT,
    event_record,
    events_first,
    events_first_announce,
    events_record_first,
    last_event_at_params,
)
from sessions_app.locks import session_lock
from sessions_app.models import (
    SESSION_STATUS_OF_TURN,
    AgentProfile,
    AgentSession,
    Artifact,
    SessionTitle,
    Step,
    Turn,
)
from sessions_app.rows import insert_together

M = TypeVar("M", AgentSession, Turn, Step)
TURN_FINISHED = (Turn.Status.COMPLETED, Turn.Status.FAILED, Turn.Status.CANCELLED)


class TurnActive(Conflict):
    """The session already has an active turn."""

    code = "turn_active"


# --- the generic guarded move ------------------------------------------------------------

def _transition(model: type[M], pk: Any, to: str, fields: Mapping[str, Any] | None = None,
                session_id: uuid.UUID | str | None = None, known: M | None = None,
                set_once: tuple[str, ...] = ()) -> tuple[M, bool]:
    """Lock, check and move one row. Returns (row, changed). Call inside atomic().

    ``known`` is the row as the caller last read it: when its status still holds (a conditional
    update says so) the move costs one query; otherwise the row is re-read under the lock.
    Fields named in ``set_once`` are written only while the row has none.
    """
    if known is not None and known.status != to and known.can_move_to(to):
        session_lock(known.session_id if model is not AgentSession else known.pk)  # type: ignore[attr-defined]
        changes = {"status": to, "updated_at": timezone.now(), **(fields or {})}
        # A set-once field the known row already has is left alone; one it lacks is written only
        # while the row still lacks it (else the row is re-read below).
        unset = {f"{name}__isnull": True for name in set_once if name in changes and getattr(known, name) is None}
        for name in set_once:
            if name in changes and getattr(known, name) is not None:
                del changes[name]
        if model.objects.filter(pk=pk, status=known.status, **unset).update(**changes):
            for name, value in changes.items():
                _set_written(known, name, value)
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
    for name in update_fields:
        _set_written(obj, name, getattr(obj, name))
    return obj, True


def _set_written(obj: Any, name: str, value: Any) -> None:
    """Keep ``obj`` as written: a field set by an expression (``F(...) + x``) is dropped from the
    instance, so reading it loads the stored value rather than the expression."""
    if hasattr(value, "resolve_expression"):
        obj.__dict__.pop(name, None)
    else:
        setattr(obj, name, value)


# --- sessions and turns ------------------------------------------------------------------

@joins_transaction
def session_transition(*, session_id: uuid.UUID | str, to: str, known: AgentSession | None = None,
                       wall_seconds_add: float = 0.0) -> AgentSession:
    """Move a session. Its status follows its turn's: ``turn_transition`` calls this. ``known``:
    the session as the caller read it under its lock (one query instead of two).
    ``wall_seconds_add``: a finished turn's wall time, added in the same write."""
    fields = {"wall_seconds": F("wall_seconds") + wall_seconds_add} if wall_seconds_add else None
    session, changed = _transition(AgentSession, session_id, to, fields, known=known)
    if changed:
        event_record(session_id=session.id, type="session.status_changed", payload={"status": to})
    elif wall_seconds_add:
        AgentSession.objects.filter(pk=session.pk).update(wall_seconds=F("wall_seconds") + wall_seconds_add)
        session.__dict__.pop("wall_seconds", None)
    return session


def _session_follow(turn: Turn, session: AgentSession | None = None, wall_seconds_add: float = 0.0) -> AgentSession:
    """Move the session to the status its turn implies (``SESSION_STATUS_OF_TURN``). ``session``:
    the row as read under its lock in this transaction and kept current since (a tick's): when
    it is there already, nothing is read (nor written, unless there is wall time to add)."""
    to = SESSION_STATUS_OF_TURN[Turn.Status(turn.status)]
    if session is not None and session.status == to and not wall_seconds_add:
        return session
    return session_transition(session_id=turn.session_id, to=to, known=session, wall_seconds_add=wall_seconds_add)


@joins_transaction
def turn_transition(*, turn_id: uuid.UUID | str, to: str, session_id: uuid.UUID | str | None = None,
                    known: Turn | None = None, session: AgentSession | None = None, **fields: Any) -> Turn:
    """Move a turn, and its session with it; stamp its times; record ``turn.<status>``.

    ``started_at`` is the first start: a turn resumed after an approval keeps it, so its wall
    time (and the wall-clock budget) counts from when it began, waits included. A finished turn
    adds its wall time to the session's. ``known`` / ``session``: the turn and its session as
    the caller read them under the session lock (a tick): no re-reads.
    """
    now = timezone.now()
    if to == Turn.Status.RUNNING:
        fields.setdefault("started_at", now)
    if to in TURN_FINISHED:
        fields.setdefault("finished_at", now)
        if (known is not None and session is not None and known.session_id == session.pk
                and connection.vendor == "postgresql" and _turn_finish_write(known, session, to, fields, now)):
            hooks.turn_ended(known)
            return known
    turn, changed = _transition(Turn, turn_id, to, fields, session_id=session_id, set_once=("started_at",),
                                known=known)
    if not changed:
        return turn
    payload: dict[str, Any] = {"status": to, "index": turn.index}
    if turn.error_code:
        payload.update(error_code=turn.error_code, error_message=turn.error_message, retryable=turn.retryable)
    if to == Turn.Status.COMPLETED:
        payload["output_text"] = turn.output_text
        if turn.verdicts is not None:
            payload.update(verdicts=turn.verdicts, criteria_unmet=turn.criteria_unmet)
    event_type = "turn.started" if to == Turn.Status.RUNNING else f"turn.{to}"
    event_record(session_id=turn.session_id, turn_id=turn.id, type=event_type, payload=payload)
    elapsed = (now - turn.started_at).total_seconds() if to in TURN_FINISHED and turn.started_at else 0.0
    _session_follow(turn, session, wall_seconds_add=elapsed)
    if to in TURN_FINISHED:
        hooks.turn_ended(turn)  # subagents: wake the parent, cancel the children (fanout_app)
    return turn


def _turn_event_payload(turn: Turn, to: str) -> dict[str, Any]:
    payload: dict[str, Any] = {"status": to, "index": turn.index}
    if turn.error_code:
        payload.update(error_code=turn.error_code, error_message=turn.error_message, retryable=turn.retryable)
    if to == Turn.Status.COMPLETED:
        payload["output_text"] = turn.output_text
        if turn.verdicts is not None:
            payload.update(verdicts=turn.verdicts, criteria_unmet=turn.criteria_unmet)
    return payload


def _turn_finish_write(turn: Turn, session: AgentSession, to: str, fields: dict[str, Any], now: Any) -> bool:
    """A turn's end in one statement (PostgreSQL), for a caller that read the turn and its session
    under the session lock (a tick): the turn moved with its ``turn.<status>`` event, the session
    following it (``session.status_changed`` when its status changes) with the turn's wall time
    added, as ``_transition``, ``event_record`` and ``session_transition`` write them in four
    statements (the end of every session's turn: bench/concurrency.py). False, with nothing
    written, when the turn is no longer where the caller read it: the general path re-reads it."""
    if turn.status == to or not turn.can_move_to(to):
        return False
    session_to = SESSION_STATUS_OF_TURN[Turn.Status(to)]
    moves_session = session.status != session_to
    if moves_session:
        session.ensure_can_move_to(session_to)
    ended = Turn(**{f.attname: getattr(turn, f.attname) for f in Turn._meta.concrete_fields})
    for name, value in {**fields, "status": to, "updated_at": now}.items():
        setattr(ended, name, value)
    elapsed = (now - turn.started_at).total_seconds() if turn.started_at else 0.0
    events: list[tuple[str, uuid.UUID | None, dict[str, Any]]] = [(f"turn.{to}", ended.id,
                                                                   _turn_event_payload(ended, to))]
    if moves_session:
        events.append(("session.status_changed", None, {"status": session_to}))
    quote = connection.ops.quote_name
    sets, params = [], []
    for name, value in {**fields, "status": to, "updated_at": now}.items():
        field = Turn._meta.get_field(name)
        sets.append(f"{quote(field.column)} = %s")  # type: ignore[union-attr,arg-type]
        params.append(field.get_db_prep_save(value, connection))  # type: ignore[union-attr]
    session_sets = ", status = %s, updated_at = %s" if moves_session else ""
    dumped = [jsontext.dumps(payload) for _, _, payload in events]
    events_json = "[" + ", ".join(
        f'{{"ord": {i}, "type": {jsontext.dumps(type_)}, '
        f'"turn_id": {jsontext.dumps(str(turn_id) if turn_id else None)}, "payload": {text}}}'
        for i, ((type_, turn_id, _), text) in enumerate(zip(events, dumped, strict=True), start=1)) + "]"
    turns, sessions = Turn._meta.db_table, AgentSession._meta.db_table
    sql = (f"WITH t AS (UPDATE {turns} SET {', '.join(sets)} WHERE id = %s AND session_id = %s AND status = %s "
           f"RETURNING id), "
           f"s AS (UPDATE {sessions} SET last_seq = last_seq + %s, {SET_LAST_EVENT_AT}, "
           f"wall_seconds = wall_seconds + %s{session_sets} FROM t WHERE {sessions}.id = %s AND {sessions}.status = %s "
           f"RETURNING last_seq), "
           f"e AS (INSERT INTO {EVENTS_TABLE} (session_id, seq, type, turn_id, step_id, payload, created_at) "
           f"SELECT %s::uuid, s.last_seq - %s::int + v.ord, v.type, v.turn_id, NULL, v.payload, %s "
           f"FROM s, jsonb_to_recordset(%s::jsonb) AS v(ord int, type text, turn_id uuid, payload jsonb)) "
           f"SELECT (SELECT count(*) FROM t), (SELECT last_seq FROM s)")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, turn.pk, session.pk, turn.status,
                             len(events), *last_event_at_params(now), elapsed,
                             *([session_to, now] if moves_session else []), session.pk, session.status,
                             session.pk, len(events), now, events_json])
        moved, last_seq = cursor.fetchone()
    if not moved:
        return False
    if last_seq is None:  # the session moved under its own lock: cannot be; refuse rather than half-write
        raise InvalidTransition(f"Session {session.pk} is no longer {session.status!r}")
    for name, value in {**fields, "status": to, "updated_at": now}.items():
        setattr(turn, name, value)
    if moves_session:
        session.status, session.updated_at = session_to, now
    session.__dict__.pop("wall_seconds", None)  # added in the database: read it back when asked
    first = last_seq - len(events) + 1
    announced = [{"seq": first + i, "type": type_, "session_id": str(session.pk), "turn_id": str(turn.pk),
                  "step_id": None, "payload": jsontext.loads(text), "created_at": now.isoformat()}
                 for i, ((type_, _, _), text) in enumerate(zip(events, dumped, strict=True))]
    transaction.on_commit(partial(announce.announce_committed, announced), robust=True)
    return True


PINNED_MAX_ITEMS = 100  # per pinned field: every model call of the session sends them all, verbatim
PINNED_ITEM_MAX_CHARS = 10_000


def _string_list(value: Any, name: str) -> list[str]:
    """A pinned field: a list of strings (null: none). A bare string is refused, as the API's
    schema for an edit refuses it (it was taken as a one-item list on create only)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise InvalidArguments(f"{name} must be a list of strings", details={"field": name})
    if len(value) > PINNED_MAX_ITEMS:
        raise InvalidArguments(f"{name} holds at most {PINNED_MAX_ITEMS} items",
                               details={"field": name, "max_items": PINNED_MAX_ITEMS})
    if any(len(x) > PINNED_ITEM_MAX_CHARS for x in value):
        raise InvalidArguments(f"each of {name} is at most {PINNED_ITEM_MAX_CHARS} characters",
                               details={"field": name, "max_chars": PINNED_ITEM_MAX_CHARS})
    return list(value)


BUDGET_FIELDS = ("max_tool_calls", "max_model_calls", "max_tokens", "max_wall_seconds")
# The most a budget column holds on every database (PostgreSQL's integer). Checked here: Django
# binds an integer field's value as a 4-byte integer on PostgreSQL (psycopg 3), so a larger one was
# stored wrapped (2**32 + 5 as 5: a "raise" that lowered the budget) or broke a constraint (a 500).
BUDGET_MAX = 2_147_483_647


INPUT_MAX_CHARS = 200_000  # a turn's input; the API's schemas say the same


def _input_check(text: Any) -> None:
    if not isinstance(text, str) or not text.strip():
        raise InvalidArguments("input must not be empty", details={"field": "input"})
    if len(text) > INPUT_MAX_CHARS:
        raise InvalidArguments(f"input is over {INPUT_MAX_CHARS} characters",
                               details={"field": "input", "max": INPUT_MAX_CHARS})


def _budget_check(name: str, value: Any) -> None:
    if name not in BUDGET_FIELDS:
        raise InvalidArguments(f"Unknown budget {name!r}", details={"field": name, "allowed": BUDGET_FIELDS})
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= BUDGET_MAX):
        raise InvalidArguments(f"Budget {name} must be an integer from 0 to {BUDGET_MAX}, or null for no limit",
                               details={"field": name, "max": BUDGET_MAX})


def _session_row(*, agent: AgentProfile, owner: User, title: str, pinned: Mapping[str, Any] | None,
                 budget: Mapping[str, Any] | None, metadata: Mapping[str, Any] | None) -> AgentSession:
    """A validated, unsaved session; budgets default to the profile's."""
    if not agent.enabled:
        raise InvalidArguments(f"Agent {agent.slug} is disabled", details={"field": "agent"})
    for field, value in (("pinned", pinned), ("budget", budget), ("metadata", metadata)):
        if value is not None and not isinstance(value, Mapping):  # dict() of a string or a list of pairs
            raise InvalidArguments(f"{field} must be an object", details={"field": field})
    pinned = dict(pinned or {})
    unknown = set(pinned) - {"requirements", "prohibitions", "acceptance_criteria"}
    if unknown:
        raise InvalidArguments(f"Unknown pinned fields: {sorted(unknown)}", details={"fields": sorted(unknown)})
    budgets: dict[str, int | None] = {name: getattr(agent, name) for name in BUDGET_FIELDS}
    for name, value in (budget or {}).items():
        _budget_check(name, value)
        budgets[name] = value
    return AgentSession(
        agent=agent, team_id=agent.team_id, owner=owner, title=title[:200],
        requirements=_string_list(pinned.get("requirements"), "requirements"),
        prohibitions=_string_list(pinned.get("prohibitions"), "prohibitions"),
        acceptance_criteria=_string_list(pinned.get("acceptance_criteria"), "acceptance_criteria"),
        metadata=dict(metadata or {}), **budgets,
    )


@transaction.atomic
def session_create(*, agent: AgentProfile, owner: User, title: str = "",
                   pinned: Mapping[str, Any] | None = None, budget: Mapping[str, Any] | None = None,
                   metadata: Mapping[str, Any] | None = None) -> AgentSession:
    """Create an idle session from an agent profile."""
    session = _session_row(agent=agent, owner=owner, title=title, pinned=pinned, budget=budget, metadata=metadata)
    session.save(force_insert=True)
    _title_insert(session)
    event_record(session_id=session.id, type="session.created",
                 payload={"agent": agent.slug, "title": session.title, "owner": owner.get_username()})
    return session


def _title_insert(session: AgentSession) -> None:
    """A new session's title row for the search (``SessionTitle``; none for no title)."""
    if session.title:
        SessionTitle(session_id=session.pk, title=session.title).save(force_insert=True)


def session_title_index(session: AgentSession) -> None:
    """The session's title row for the search (``SessionTitle``) as the title now is: after an
    edit in the admin (which writes only the columns its form changed, ``ChangedFieldsAdmin``)."""
    if session.title:
        SessionTitle.objects.update_or_create(session_id=session.pk, defaults={"title": session.title})
    else:
        SessionTitle.objects.filter(session_id=session.pk).delete()


PINNED_FIELDS = ("requirements", "prohibitions", "acceptance_criteria")


@transaction.atomic
def session_pinned_update(*, session_id: uuid.UUID | str, actor: User | None,
                          pinned: Mapping[str, Any]) -> AgentSession:
    """Replace the pinned context (the fields given; the others stay). Takes effect at the next
    model call; a worker holding the prompt in memory rebuilds it (``pinned_revision``). A replay
    of the same values changes nothing. Event ``session.pinned_changed`` (before and after)."""
    unknown = set(pinned) - set(PINNED_FIELDS)
    if unknown:
        raise InvalidArguments(f"Unknown pinned fields: {sorted(unknown)}", details={"fields": sorted(unknown)})
    session_lock(session_id)
    session = AgentSession.objects.get(pk=session_id)
    after = {name: _string_list(pinned[name], name) if name in pinned else getattr(session, name)
             for name in PINNED_FIELDS}
    before = {name: getattr(session, name) for name in PINNED_FIELDS}
    if after == before:
        return session
    for name, value in after.items():
        setattr(session, name, value)
    session.pinned_revision += 1
    session.save(update_fields=[*PINNED_FIELDS, "pinned_revision", "updated_at"])
    latest_turn = Turn.objects.filter(session_id=session.id).order_by("-index").values_list("id", flat=True).first()
    event_record(session_id=session.id, turn_id=latest_turn, type="session.pinned_changed",
                 payload={"before": before, "after": after, "revision": session.pinned_revision,
                          "by": actor.get_username() if actor else ""})
    return session


@transaction.atomic
def session_compact_request(*, session_id: uuid.UUID | str, actor: User | None) -> AgentSession:
    """Ask for a compaction before the session's next model call (now, when a turn runs; else at
    the next turn). Idempotent while one is pending. Event ``session.compact_requested``."""
    session_lock(session_id)
    session = AgentSession.objects.get(pk=session_id)
    if session.compact_requested:
        return session
    session.compact_requested = True
    session.save(update_fields=["compact_requested", "updated_at"])
    latest_turn = Turn.objects.filter(session_id=session.id).order_by("-index").values_list("id", flat=True).first()
    event_record(session_id=session.id, turn_id=latest_turn, type="session.compact_requested",
                 payload={"by": actor.get_username() if actor else ""})
    return session


@transaction.atomic
def session_create_with_turn(*, agent: AgentProfile, owner: User, input: str, title: str = "",
                             pinned: Mapping[str, Any] | None = None, budget: Mapping[str, Any] | None = None,
                             metadata: Mapping[str, Any] | None = None,
                             idempotency_key: str = "") -> tuple[AgentSession, Turn]:
    """Create a session with its first turn queued: what ``session_create`` then ``turn_create``
    would write (the session moved idle → in_progress, the events session.created,
    session.status_changed and turn.queued), in one statement on PostgreSQL (four elsewhere): nobody
    else can see the session before it commits, so there is nothing to lock. The caller starts the
    engine."""
    _input_check(input)
    session = _session_row(agent=agent, owner=owner, title=title, pinned=pinned, budget=budget, metadata=metadata)
    session.ensure_can_move_to(AgentSession.Status.IN_PROGRESS)  # the guarded move of a new (idle) session
    session.status = SESSION_STATUS_OF_TURN[Turn.Status.QUEUED]
    session.last_seq, session.last_event_at = 3, timezone.now()
    turn = Turn(session=session, index=1, input=input, created_by=owner, idempotency_key=idempotency_key)
    first: list[tuple[str, Mapping[str, Any], uuid.UUID | None]] = [
        ("session.created", {"agent": agent.slug, "title": session.title, "owner": owner.get_username()}, None),
        ("session.status_changed", {"status": session.status}, None),
        ("turn.queued", {"index": turn.index, "input": input}, turn.id)]
    if connection.vendor != "postgresql":
        session.save(force_insert=True)
        _title_insert(session)
        turn.save(force_insert=True)
        events_record_first(session=session, events=first)
        return session, turn
    # One statement (``rows.insert_together``): the ORM's four inserts were half the CPU of
    # POST /api/sessions, which a burst of new sessions spends before any of them is driven.
    events = events_first(session=session, events=first)
    titles = [SessionTitle(session_id=session.pk, title=session.title)] if session.title else []
    insert_together([([session], ()), (titles, ()), ([turn], ()), (events, ("id",))])
    events_first_announce(events)
    return session, turn


@transaction.atomic
def turn_create(*, session_id: uuid.UUID | str, input: str, actor: User | None = None,
                idempotency_key: str = "") -> Turn:
    """Queue a new turn. Refuses with 409 ``turn_active`` while another turn is active; the same
    ``idempotency_key`` again returns the turn it created. The caller starts the engine."""
    _input_check(input)
    try:
        session = AgentSession.objects.select_for_update().get(pk=session_id)
    except (AgentSession.DoesNotExist, ValueError) as exc:
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
    _session_follow(turn)
    event_record(session_id=session.id, turn_id=turn.id, type="turn.queued", payload={"index": index, "input": input})
    return turn


class BudgetLowered(InvalidArguments):
    """A budget may only be raised here (or lifted: null is no limit)."""

    code = "budget_lowered"


@transaction.atomic
def session_budget_raise(*, session_id: uuid.UUID | str, actor: User, budget: Mapping[str, Any]) -> AgentSession:
    """Raise (or lift, with None) some of a session's budgets; record ``budget.raised``.

    Idempotent: the same values again change nothing and record nothing. Lowering a budget is
    refused (422 ``budget_lowered``): a limit under what was used already would only fail the next
    call. Needs the permission to operate sessions.
    """
    require_perm(actor, OPERATE_SESSIONS)
    for name, value in budget.items():
        _budget_check(name, value)
    try:
        session_lock(session_id)
        session = AgentSession.objects.select_for_update().get(pk=session_id)
    except (AgentSession.DoesNotExist, ValueError, ValidationError) as exc:
        raise NotFound(f"No session {session_id}") from exc
    before = {name: getattr(session, name) for name in budget}
    changed = {name: value for name, value in budget.items() if value != before[name]}
    lowered = [name for name, value in changed.items() if value is not None
               and (before[name] is None or value < before[name])]
    if lowered:
        raise BudgetLowered(f"A budget can only be raised here: {', '.join(lowered)}.",
                            details={"fields": lowered, "current": {n: before[n] for n in lowered}})
    if not changed:
        return session  # a replay changes nothing
    for name, value in changed.items():
        setattr(session, name, value)
    session.save(update_fields=[*changed, "updated_at"])
    event_record(session_id=session.id, type="budget.raised",
                 payload={"before": {n: before[n] for n in changed}, "after": changed,
                          "by": actor.get_username()})
    return session


# --- steps -------------------------------------------------------------------------------

def step_event_payload(step: Step, **extra: Any) -> dict[str, Any]:
    """The base every step event carries: what the timeline needs to place and label it."""
    return {"status": step.status, "index": step.index, "kind": step.kind, "tool": step.tool_name, **extra}


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
                     payload=step_event_payload(step, **(event_payload or {})))
    return step


def step_result_dropped(step: Step, event_type: str) -> None:
    """Record that a step's work finished after the step was settled (cancelled): its result is not
    kept, and the timeline says so instead of staying silent."""
    status = Step.objects.filter(pk=step.id).values_list("status", flat=True).first()
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type=event_type,
                 payload=step_event_payload(step, status=status or "", dropped=True))


def worker_id() -> str:
    """Who holds a lease: this host, process and thread."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def step_leases_renew(*, step_ids: list[uuid.UUID], owners: set[str], lease_seconds: float) -> int:
    """Extend the leases of running steps still held by ``owners`` (a worker that is alive and still
    working on them). A step someone else claimed since, or that settled, is left alone."""
    return Step.objects.filter(pk__in=step_ids, status=Step.Status.RUNNING, lease_owner__in=owners).update(
        lease_expires_at=timezone.now() + timedelta(seconds=lease_seconds))


def lease_seconds_for(timeout_seconds: float) -> float:
    """A lease outlives the longest legitimate run: the work's timeout plus a margin."""
    return float(timeout_seconds) + float(settings.AGENTOPS_LEASE_SECONDS)


def _started_event(step: Step, event_type: str, extra: Mapping[str, Any] | None = None) -> None:
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type=event_type,
                 payload=step_event_payload(step, attempt=step.attempts,
                                            arguments=step.arguments if step.kind == Step.Kind.TOOL else None,
                                            **(extra or {})))


@joins_transaction
def step_claim(*, step_id: uuid.UUID | str, from_status: str, lease_seconds: float, event_type: str,
               event_payload: Mapping[str, Any] | None = None, known: Step | None = None,
               owner: str | None = None) -> Step | None:
    """``from_status`` → running with a lease, by a conditional update: exactly one caller wins.

    A redelivered or duplicated task finds the step no longer in ``from_status`` and gets None.
    ``known`` is the row as the caller read it: its fields, but not its status, are trusted.
    ``owner`` names the lease's holder when it is not this worker (a customer runner's poll).
    """
    Step(status=from_status).ensure_can_move_to(Step.Status.RUNNING)
    session_id = known.session_id if known is not None else (
        Step.objects.filter(pk=step_id).values_list("session_id", flat=True).first())
    if session_id is None:
        return None
    session_lock(session_id)
    now = timezone.now()
    owner, lease = owner or worker_id(), now + timedelta(seconds=lease_seconds)
    claimed = Step.objects.filter(pk=step_id, status=from_status).update(
        status=Step.Status.RUNNING, lease_owner=owner, lease_expires_at=lease,
        attempts=F("attempts") + 1, started_at=now, updated_at=now)
    if not claimed:
        return None
    if known is not None:
        step = known
        step.status, step.lease_owner, step.lease_expires_at = Step.Status.RUNNING, owner, lease
        step.attempts, step.started_at = step.attempts + 1, now
    else:
        step = Step.objects.get(pk=step_id)
    _started_event(step, event_type, event_payload)
    return step


def step_running(*, session_id: uuid.UUID, turn_id: uuid.UUID, index: int, kind: str,
                 lease_seconds: float) -> Step:
    """A new step, not yet saved, claimed by this worker as it is created (planned → running)."""
    Step(status=Step.Status.PLANNED).ensure_can_move_to(Step.Status.RUNNING)
    now = timezone.now()
    return Step(session_id=session_id, turn_id=turn_id, index=index, kind=kind, status=Step.Status.RUNNING,
                lease_owner=worker_id(), lease_expires_at=now + timedelta(seconds=lease_seconds), attempts=1,
                started_at=now)


@joins_transaction
def step_create_claimed(*, session_id: uuid.UUID, turn_id: uuid.UUID, index: int, kind: str,
                        lease_seconds: float, event_type: str) -> Step:
    """Insert a step already claimed by this worker (no planned row to claim a moment later)."""
    session_lock(session_id)
    step = step_running(session_id=session_id, turn_id=turn_id, index=index, kind=kind, lease_seconds=lease_seconds)
    step.save(force_insert=True)
    _started_event(step, event_type)
    return step


# --- artifacts ---------------------------------------------------------------------------

@joins_transaction
def artifact_record(*, session_id: uuid.UUID | str, path: str, size: int, sha256: str, storage_path: str,
                    content_type: str = "application/octet-stream", turn_id: uuid.UUID | str | None = None,
                    step_id: uuid.UUID | str | None = None) -> Artifact:
    """Record a published file (content-addressed: the same content twice is one row)."""
    artifact, created = Artifact.objects.get_or_create(
        session_id=uuid.UUID(str(session_id)), path=path, sha256=sha256,
        defaults={"size": size, "storage_path": storage_path, "content_type": content_type,
                  "turn_id": turn_id, "step_id": step_id},
    )
    if created:
        event_record(session_id=session_id, turn_id=turn_id, step_id=step_id, type="artifact.published",
                     payload={"artifact_id": str(artifact.id), "path": path, "size": size, "sha256": sha256})
    return artifact


@joins_transaction
def artifact_delete(*, artifact_id: uuid.UUID | str, session_id: uuid.UUID | str) -> None:
    """Forget a published file of a session (its row; the stored file is removed after commit)."""
    artifact = Artifact.objects.filter(pk=artifact_id, session_id=uuid.UUID(str(session_id))).first()
    if artifact is None:
        raise NotFound(f"No artifact {artifact_id} in this session")
    storage_path = artifact.storage_path
    shared = Artifact.objects.filter(storage_path=storage_path).exclude(pk=artifact.pk).exists()
    artifact.delete()
    event_record(session_id=session_id, type="artifact.deleted",
                 payload={"artifact_id": str(artifact_id), "path": artifact.path})
    if not shared:
        root = Path(settings.AGENTOPS_ARTIFACT_ROOT).resolve()
        path = (root / storage_path).resolve()
        if path.is_relative_to(root):
            transaction.on_commit(lambda: path.unlink(missing_ok=True))


# --- the integrations: session quota, metadata, deletion -----------------------------------------

class TooManyActiveSessions(DomainError):
    """Too many of your sessions are working at once; wait for one to finish."""

    code = "rate_limit_exceeded"
    status = 429


def session_quota_check(*, owner: User) -> None:
    """Refuse (429) a new session while ``owner`` has AGENTOPS_MAX_ACTIVE_SESSIONS_PER_USER
    sessions in progress (no limit when the setting is empty)."""
    limit = settings.AGENTOPS_MAX_ACTIVE_SESSIONS_PER_USER
    if limit is None:
        return
    active = AgentSession.objects.filter(owner=owner).exclude(
        status__in=(AgentSession.Status.IDLE, AgentSession.Status.FAILED)).count()
    if active >= limit:
        raise TooManyActiveSessions(details={"limit": limit, "active": active})


@transaction.atomic
def session_metadata_update(*, session_id: uuid.UUID | str, metadata: Mapping[str, Any]) -> None:
    """Replace a session's metadata (the integration's own key/value pairs)."""
    session_lock(session_id)
    AgentSession.objects.filter(pk=session_id).update(metadata=dict(metadata), updated_at=timezone.now())


@transaction.atomic
def session_delete(*, session_id: uuid.UUID | str) -> None:
    """Delete a session and everything it holds. A session with an active turn is refused (409):
    cancel it first, so no worker is left running for a session that no longer exists."""
    session_lock(session_id)
    if Turn.objects.filter(session_id=uuid.UUID(str(session_id)), status__in=Turn.ACTIVE).exists():
        raise TurnActive("This session has an active turn; cancel it before deleting the session.")
    AgentSession.objects.filter(pk=session_id).delete()
