"""Ending a turn early: failed (a budget, a model error, a crash loop) or cancelled by an operator.

Both settle every open step of the turn and cancel its open approval requests in the same
transaction, so nothing is left waiting for a reviewer or a worker.
"""

import uuid

from django.contrib.auth.models import User

from agentops.domain import joins_transaction
from approvals_app.services import approval_cancel_open
from sessions_app.engine.budgets import Budget
from sessions_app.events import event_record
from sessions_app.locks import locked_with_session
from sessions_app.models import Step, Turn
from sessions_app.services import step_transition, turn_transition


def _settle_open_steps(turn_id: uuid.UUID, to: str, code: str) -> None:
    """Move every unsettled step of the turn to ``to`` (a step that cannot go there is cancelled)."""
    for step in Step.objects.select_for_update().filter(turn_id=turn_id).exclude(status__in=Step.SETTLED):
        target = to if step.can_move_to(to) else Step.Status.CANCELLED
        step_transition(step_id=step.id, session_id=step.session_id, to=target, error_code=code,
                        event_type=f"{'tool' if step.kind == Step.Kind.TOOL else 'model'}.{target}")


@joins_transaction
def turn_fail(*, turn_id: uuid.UUID | str, code: str, message: str, retryable: bool = False) -> Turn | None:
    """Fail an active turn and settle its open steps. None when the turn had finished already."""
    turn = locked_with_session(Turn.objects.all(), pk=turn_id)
    if not turn.is_active:
        return None
    approval_cancel_open(turn_id=turn.id)
    _settle_open_steps(turn.id, Step.Status.FAILED, code)
    return turn_transition(turn_id=turn.id, session_id=turn.session_id, to=Turn.Status.FAILED, error_code=code,
                           error_message=message[:2000], retryable=retryable)


@joins_transaction
def turn_fail_budget(*, turn_id: uuid.UUID, session_id: uuid.UUID, budget: Budget) -> Turn | None:
    """The next call would cross a budget: say which (``budget.exceeded``) and fail the turn."""
    event_record(session_id=session_id, turn_id=turn_id, type="budget.exceeded",
                 payload={"budget": budget.name, "limit": budget.limit, "used": budget.used})
    # Retryable: once an operator raises the budget (``session_budget_raise``), a retry goes on.
    return turn_fail(turn_id=turn_id, code="budget_exceeded", message=budget.message(), retryable=True)


@joins_transaction
def turn_cancel(*, turn_id: uuid.UUID | str, actor: User | None = None) -> Turn | None:
    """Cancel an active turn: its approvals, its open steps (a running command is killed by its
    sandbox, which polls the step's status), the turn. None when it had finished already."""
    turn = locked_with_session(Turn.objects.all(), pk=turn_id)
    if not turn.is_active:
        return None
    approval_cancel_open(turn_id=turn.id)
    _settle_open_steps(turn.id, Step.Status.CANCELLED, "cancelled")
    return turn_transition(turn_id=turn.id, session_id=turn.session_id, to=Turn.Status.CANCELLED,
                           error_code="cancelled",
                           error_message=f"Cancelled by {actor.get_username() if actor else 'the system'}.")
