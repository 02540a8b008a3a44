"""The event log: every state change appends an event to its session's timeline.

``(session, seq)`` is unique and gap-free per session. The seq comes from one
``UPDATE … RETURNING`` on the session row: the row lock serialises concurrent writers, and a
rolled-back writer rolls back its seq too. Events are written in the caller's transaction and
announced on the channel layer after commit.
"""

import uuid
from collections.abc import Mapping
from contextlib import nullcontext
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from agentops import jsontext
from agentops.domain import NotFound
from sessions_app import announce
from sessions_app.models import AgentSession, Event

SESSIONS_TABLE = AgentSession._meta.db_table
EVENTS_TABLE = Event._meta.db_table
# last_event_at moves at most once a second: the session row is updated with every event, and an
# update that leaves every indexed column alone is a HOT update on PostgreSQL (no index writes).
SET_LAST_EVENT_AT = ("last_event_at = CASE WHEN last_event_at IS NULL OR last_event_at < %s THEN %s "
                     "ELSE last_event_at END")


def last_event_at_params(now: datetime) -> tuple[datetime, datetime]:
    """The parameters of ``SET_LAST_EVENT_AT``."""
    return now - timedelta(seconds=1), now


def db_uuid(value: uuid.UUID | str) -> str:
    """A UUID as a raw SQL parameter: SQLite stores 32 hex chars, PostgreSQL a uuid; hex fits both."""
    return uuid.UUID(str(value)).hex


def event_record(*, session_id: uuid.UUID | str, type: str, payload: Mapping[str, Any] | None = None,
                 turn_id: uuid.UUID | str | None = None, step_id: uuid.UUID | str | None = None) -> Event:
    """Append an event to the session's timeline and announce it after commit.

    Runs in the caller's transaction (or its own); raises NotFound for an unknown session.
    """
    now = timezone.now()
    data = dict(payload or {})
    with transaction.atomic() if not connection.in_atomic_block else nullcontext():
        if connection.vendor == "postgresql":
            event = _insert_postgres(session_id, type, data, turn_id, step_id, now)
        else:
            event = _insert_portable(session_id, type, data, turn_id, step_id, now)
        transaction.on_commit(partial(announce.announce_committed, [event.as_dict()]), robust=True)
    return event


def events_record_first(*, session: AgentSession, events: list[tuple[str, Mapping[str, Any],
                                                                   uuid.UUID | None]]) -> None:
    """Insert the first events of a session this transaction has just created, seqs 1..n, in one
    statement. Only for a new session (no one else can write to it yet); its ``last_seq`` must
    already be n. ``events`` are (type, payload, turn_id)."""
    rows = events_first(session=session, events=events)
    Event.objects.bulk_create(rows)
    events_first_announce(rows)


def events_first(*, session: AgentSession,
                 events: list[tuple[str, Mapping[str, Any], uuid.UUID | None]]) -> list[Event]:
    """``events_record_first``'s rows, unsaved (for a caller that inserts them with others)."""
    now = timezone.now()
    return [Event(session_id=session.id, seq=seq, type=type_, payload=dict(payload), turn_id=turn_id, created_at=now)
            for seq, (type_, payload, turn_id) in enumerate(events, start=1)]


def events_first_announce(rows: list[Event]) -> None:
    """Announce a new session's first events once the transaction that inserted them commits."""
    transaction.on_commit(partial(announce.announce_committed, [event.as_dict() for event in rows]), robust=True)


def _insert_portable(session_id: uuid.UUID | str, type: str, payload: dict[str, Any],
                     turn_id: uuid.UUID | str | None, step_id: uuid.UUID | str | None, now: datetime) -> Event:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {SESSIONS_TABLE} SET last_seq = last_seq + 1, {SET_LAST_EVENT_AT} WHERE id = %s "
            "RETURNING last_seq", [*last_event_at_params(now), db_uuid(session_id)])
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"No session {session_id}")
    return Event.objects.create(session_id=session_id, seq=row[0], type=type, payload=payload,
                                turn_id=turn_id, step_id=step_id, created_at=now)


def _insert_postgres(session_id: uuid.UUID | str, type: str, payload: dict[str, Any],
                     turn_id: uuid.UUID | str | None, step_id: uuid.UUID | str | None, now: datetime) -> Event:
    """Allocate the seq and insert the event in one round trip."""
    sid = uuid.UUID(str(session_id))
    tid = uuid.UUID(str(turn_id)) if turn_id else None
    stid = uuid.UUID(str(step_id)) if step_id else None
    text = jsontext.dumps(payload)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH s AS (UPDATE {SESSIONS_TABLE} SET last_seq = last_seq + 1, {SET_LAST_EVENT_AT} WHERE id = %s "
            f"RETURNING last_seq) INSERT INTO {EVENTS_TABLE} "
            "(session_id, seq, type, turn_id, step_id, payload, created_at) "
            "SELECT %s, s.last_seq, %s, %s, %s, %s::jsonb, %s FROM s RETURNING id, seq",
            [*last_event_at_params(now), sid, sid, type, tid, stid, text, now])
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"No session {session_id}")
    event = Event(id=row[0], session_id=sid, seq=row[1], type=type, turn_id=tid, step_id=stid,
                  payload=jsontext.loads(text), created_at=now)
    event._state.adding = False
    return event
