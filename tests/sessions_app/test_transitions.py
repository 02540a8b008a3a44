from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from agentops.domain import InvalidTransition
from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_request_create, approval_transition
from sessions_app.models import AgentSession, Event, Step, Turn
from sessions_app.services import session_transition, step_transition, turn_transition
from tests import factories
from tests.concurrency import run_together


def _pairs(model: Any) -> list[tuple[str, str]]:
    return [(src, dst) for src, targets in model.TRANSITIONS.items() for dst in sorted(targets)]


def _illegal(model: Any) -> list[tuple[str, str]]:
    statuses = [s.value for s in model.Status]
    return [(src, dst) for src in statuses for dst in statuses
            if dst != src and dst not in model.TRANSITIONS.get(src, frozenset())]


def _turn_in(status: str) -> Turn:
    turn = factories.turn()
    Turn.objects.filter(pk=turn.pk).update(status=status)
    return turn


def _step_in(status: str) -> Step:
    step = factories.step(factories.turn())
    Step.objects.filter(pk=step.pk).update(status=status)
    return step


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), _pairs(AgentSession))
def test_session_transition_every_legal_move(src: str, dst: str) -> None:
    session = factories.session()
    AgentSession.objects.filter(pk=session.pk).update(status=src)
    moved = session_transition(session_id=session.id, to=dst)
    assert moved.status == dst
    assert AgentSession.objects.get(pk=session.pk).status == dst
    assert Event.objects.filter(session=session, type="session.status_changed", payload__status=dst).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), _pairs(Turn))
def test_turn_transition_every_legal_move(src: str, dst: str) -> None:
    turn = _turn_in(src)
    assert turn_transition(turn_id=turn.id, to=dst).status == dst
    assert Turn.objects.get(pk=turn.pk).status == dst


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), _pairs(Step))
def test_step_transition_every_legal_move(src: str, dst: str) -> None:
    step = _step_in(src)
    assert step_transition(step_id=step.id, to=dst, event_type="tool.moved").status == dst
    assert Step.objects.get(pk=step.pk).status == dst


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), _pairs(ApprovalRequest))
def test_approval_transition_every_legal_move(src: str, dst: str) -> None:
    step = factories.step(factories.turn(), approval_mode="mutating")
    approval = approval_request_create(step_id=step.id)
    ApprovalRequest.objects.filter(pk=approval.pk).update(status=src)
    assert approval_transition(request_id=approval.request_id, to=dst).status == dst


@pytest.mark.django_db
@pytest.mark.parametrize(("model", "make", "move"), [
    (AgentSession, lambda s: _session_in(s), lambda o, d: session_transition(session_id=o.id, to=d)),
    (Turn, _turn_in, lambda o, d: turn_transition(turn_id=o.id, to=d)),
    (Step, _step_in, lambda o, d: step_transition(step_id=o.id, to=d)),
])
def test_transition_illegal_moves_raise_409_and_change_nothing(model: Any, make: Callable[[str], Any],
                                                               move: Callable[[Any, str], Any]) -> None:
    illegal = _illegal(model)
    assert illegal, "every machine has illegal moves"
    for src, dst in illegal[:: max(1, len(illegal) // 8)]:  # a spread sample
        obj = make(src)
        events_before = Event.objects.filter(session_id=getattr(obj, "session_id", obj.pk)).count()
        with pytest.raises(InvalidTransition) as info:
            move(obj, dst)
        assert info.value.status == 409
        assert model.objects.get(pk=obj.pk).status == src
        assert Event.objects.filter(session_id=getattr(obj, "session_id", obj.pk)).count() == events_before


def _session_in(status: str) -> AgentSession:
    session = factories.session()
    AgentSession.objects.filter(pk=session.pk).update(status=status)
    return session


@pytest.mark.django_db
def test_transition_to_same_status_is_a_no_op() -> None:
    turn = _turn_in("running")
    before = Event.objects.filter(session_id=turn.session_id).count()
    assert turn_transition(turn_id=turn.id, to="running").status == "running"
    assert Event.objects.filter(session_id=turn.session_id).count() == before


@pytest.mark.django_db
def test_check_constraint_rejects_unknown_status() -> None:
    from django.db import IntegrityError, transaction

    turn = factories.turn()
    with pytest.raises(IntegrityError), transaction.atomic():
        Turn.objects.filter(pk=turn.pk).update(status="bogus")


@pytest.mark.django_db(transaction=True)
def test_turn_transition_racing_moves_yield_exactly_one() -> None:
    turn = _turn_in("running")

    def move(to: str) -> str:
        try:
            turn_transition(turn_id=turn.id, to=to)
            return to
        except InvalidTransition:
            return "refused"

    outcomes = run_together([partial(move, to) for to in ("completed", "cancelled")])
    final = Turn.objects.get(pk=turn.pk).status
    assert sorted(outcomes) == sorted([final, "refused"])
    assert Event.objects.filter(turn_id=turn.id, type__in=["turn.completed", "turn.cancelled"]).count() == 1


@pytest.mark.django_db
def test_turn_transition_resumed_turn_keeps_its_first_start() -> None:
    turn = factories.turn()
    first = turn_transition(turn_id=turn.id, to="running").started_at
    assert first is not None
    turn_transition(turn_id=turn.id, to="awaiting_approval")
    resumed = turn_transition(turn_id=turn.id, to="running")
    assert resumed.started_at == first == Turn.objects.get(pk=turn.pk).started_at
    done = turn_transition(turn_id=turn.id, to="completed")
    # The session's wall time covers the whole turn, the wait for the reviewer included.
    assert done.finished_at is not None
    wall = AgentSession.objects.get(pk=turn.session_id).wall_seconds
    assert wall >= (done.finished_at - first).total_seconds() > 0
