"""A new turn's first tick starts the turn and claims its first model step in one statement on
PostgreSQL (``tick._start_claiming_model``), with the rows and events the transition services
write elsewhere; and the turn's move in ``step_outcome_record`` is guarded as a claim is."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agentops.domain import InvalidTransition
from sessions_app.engine import tick
from sessions_app.engine.commands import session_start
from sessions_app.engine.record import TurnStart, step_outcome_record
from sessions_app.engine.tick import turn_tick
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from sessions_app.services import step_running
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
