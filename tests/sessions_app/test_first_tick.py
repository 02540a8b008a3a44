"""A turn's first tick and its end, each one statement on PostgreSQL: the tick starts a new turn
and claims its first model step (``tick._start_claiming_model``), and a turn read under the
session lock ends with its session (``services._turn_finish_write``), with the rows and events the
transition services write in several; both guarded as a claim is."""

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentops.domain import InvalidTransition
from sessions_app import services
from sessions_app.engine import tick
from sessions_app.engine.commands import session_start
from sessions_app.engine.record import TurnStart, step_outcome_record
from sessions_app.engine.tick import turn_tick
from sessions_app.locks import session_lock_fetch
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from sessions_app.services import step_running, turn_transition
from tests import factories

pytestmark = [pytest.mark.django_db,
              pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement write is PostgreSQL's")]

STEP_SKIP = {"id", "session_id", "turn_id", "created_at", "updated_at", "started_at", "lease_expires_at"}


def _new_turn(agent: AgentProfile) -> tuple[AgentSession, Turn]:
    owner = User.objects.filter(username="owner").first() or factories.user("owner")
    session, turn = session_start(agent=agent, owner=owner, input="say hi")
    assert turn is not None
    return session, turn


def _written(session: AgentSession, turn: Turn) -> dict[str, Any]:
    stored = Turn.objects.get(pk=turn.pk)
    step = Step.objects.get(turn=turn)
    events = list(Event.objects.filter(session=session).order_by("seq").values("seq", "type", "payload", "step_id",
                                                                             "turn_id"))
    return {
        "turn": (stored.status, stored.started_at is not None, stored.finished_at),
        "session": AgentSession.objects.values("status", "last_seq", "model_calls").get(pk=session.pk),
        "step": {f.attname: getattr(step, f.attname) for f in Step._meta.concrete_fields if f.attname not in STEP_SKIP},
        "leased": step.lease_expires_at is not None and step.started_at is not None,
        "events": [{**e, "step_id": e["step_id"] == step.id if e["step_id"] else None,
                    "turn_id": e["turn_id"] == turn.id} for e in events],
    }


def test_a_new_turns_first_tick_is_one_write_with_the_services_rows(agent: AgentProfile,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    session, turn = _new_turn(agent)
    with CaptureQueriesContext(connection) as queries:
        claimed = turn_tick(turn.id, calls_models=True, session_id=session.id)
    assert claimed is not None and claimed.step.kind == Step.Kind.MODEL and claimed.no_history
    sql = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    writes = [s for s in sql if not s.startswith("SELECT")]
    assert len(writes) == 1, writes  # was four: the turn, its event, the step, its event
    assert claimed.turn is not None and claimed.turn.status == Turn.Status.RUNNING and claimed.turn.started_at
    assert claimed.step.status == Step.Status.RUNNING and not claimed.step._state.adding

    monkeypatch.setattr(tick, "_starts_with_a_model_call", lambda *args: False)  # the transition services
    orm_session, orm_turn = _new_turn(agent)
    orm_claimed = turn_tick(orm_turn.id, calls_models=True, session_id=orm_session.id)
    assert orm_claimed is not None and orm_claimed.no_history

    ours, theirs = _written(session, turn), _written(orm_session, orm_turn)
    assert ours == theirs
    assert [e["type"] for e in ours["events"]][-2:] == ["turn.started", "model.started"]
    assert ours["step"]["lease_owner"] and ours["step"]["attempts"] == 1 and ours["leased"]


def test_a_turn_start_applies_only_while_the_turn_is_where_it_was_read(agent: AgentProfile) -> None:
    session, turn = _new_turn(agent)
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.CANCELLED)
    before = AgentSession.objects.get(pk=session.pk).last_seq
    step = step_running(session_id=session.id, turn_id=turn.id, index=0, kind=Step.Kind.MODEL, lease_seconds=60)
    with pytest.raises(InvalidTransition), transaction.atomic():
        step_outcome_record(session_id=session.id, turn_id=turn.id, turn_start=TurnStart(Turn.Status.QUEUED),
                            step_inserts=[step], events=[("turn.started", None, {})])
    assert Turn.objects.get(pk=turn.pk).status == Turn.Status.CANCELLED
    assert not Step.objects.filter(turn=turn).exists()
    assert AgentSession.objects.get(pk=session.pk).last_seq == before
    with pytest.raises(InvalidTransition):
        TurnStart(Turn.Status.COMPLETED)  # a finished turn does not start again


def _finish(agent: AgentProfile, to: str, **fields: Any) -> tuple[AgentSession, Turn, int]:
    session, turn = _new_turn(agent)
    assert turn_tick(turn.id, calls_models=True, session_id=session.id) is not None  # running
    Turn.objects.filter(pk=turn.pk).update(started_at=timezone.now() - timedelta(seconds=3))
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        locked = session_lock_fetch(session.id)
        assert locked is not None
        known = Turn.objects.get(pk=turn.pk)
        ended = turn_transition(turn_id=turn.id, session_id=session.id, to=to, known=known, session=locked, **fields)
    assert ended.status == to and ended.finished_at is not None and locked.status == AgentSession.Status.IDLE or (
        to == Turn.Status.FAILED and locked.status == AgentSession.Status.FAILED)
    writes = [q["sql"] for q in queries.captured_queries
              if not q["sql"].startswith(("SELECT", "SAVEPOINT", "RELEASE", "BEGIN", "COMMIT"))]
    return session, turn, len(writes)


def _ended(session: AgentSession, turn: Turn) -> dict[str, Any]:
    stored = Turn.objects.get(pk=turn.pk)
    row = AgentSession.objects.get(pk=session.pk)
    return {
        "turn": {f.attname: getattr(stored, f.attname) for f in Turn._meta.concrete_fields
                 if f.attname not in {"id", "session_id", "created_at", "updated_at", "started_at", "finished_at"}},
        "turn_times": bool(stored.started_at and stored.finished_at and stored.finished_at >= stored.started_at),
        "session": (row.status, row.last_seq, round(row.wall_seconds)),
        "events": [{**e, "turn_id": e["turn_id"] == turn.id if e["turn_id"] else None} for e in
                   Event.objects.filter(session=session).order_by("seq").values("seq", "type", "payload", "turn_id")],
    }


@pytest.mark.parametrize(("to", "fields"), [
    (Turn.Status.COMPLETED, {"output_text": "done ✓", "verdicts": [{"criterion": "c", "met": True}],
                             "criteria_unmet": False}),
    (Turn.Status.FAILED, {"error_code": "model_unavailable", "error_message": "down", "retryable": True}),
    (Turn.Status.CANCELLED, {}),
])
def test_a_turns_end_read_under_the_lock_is_one_write_with_the_services_rows(
        agent: AgentProfile, monkeypatch: pytest.MonkeyPatch, to: str, fields: dict[str, Any]) -> None:
    session, turn, writes = _finish(agent, to, **fields)
    assert writes == 1  # was four: the turn, its event, the session, its event
    monkeypatch.setattr(services, "_turn_finish_write", lambda *args: False)  # the general path
    orm_session, orm_turn, orm_writes = _finish(agent, to, **fields)
    assert orm_writes == 4
    ours = _ended(session, turn)
    assert ours == _ended(orm_session, orm_turn)
    assert [e["type"] for e in ours["events"]][-2:] == [f"turn.{to}", "session.status_changed"]
    assert ours["session"][2] == 3  # the turn's wall time, added to the session's


def test_a_turns_end_whose_turn_moved_meanwhile_takes_the_general_path(agent: AgentProfile) -> None:
    session, turn = _new_turn(agent)
    with transaction.atomic():
        locked = session_lock_fetch(session.id)
        assert locked is not None
        known = Turn.objects.get(pk=turn.pk)  # queued, as read
        Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.RUNNING)  # moved since
        assert not services._turn_finish_write(known, locked, Turn.Status.CANCELLED, {}, timezone.now())
        assert Turn.objects.get(pk=turn.pk).status == Turn.Status.RUNNING and known.status == Turn.Status.QUEUED
        ended = turn_transition(turn_id=turn.id, session_id=session.id, to=Turn.Status.CANCELLED, known=known,
                                session=locked)
    assert ended.status == Turn.Status.CANCELLED == Turn.objects.get(pk=turn.pk).status
    types = list(Event.objects.filter(session=session).order_by("seq").values_list("type", flat=True))
    assert types[-2:] == ["turn.cancelled", "session.status_changed"] and types.count("turn.cancelled") == 1
