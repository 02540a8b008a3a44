"""What the interfaces call to drive agent work. Each wakes the engine after commit."""

import json
import uuid
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from agentops import dispatch
from agentops.domain import Conflict, InvalidArguments, NotFound
from agentops.permissions import OPERATE_SESSIONS, require_perm
from sessions_app import hooks
from sessions_app.engine.budgets import Budget, budget_crossed, session_counters
from sessions_app.engine.turns import turn_cancel
from sessions_app.events import event_record
from sessions_app.locks import session_lock
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from sessions_app.services import (
    TurnActive,
    session_create,
    session_create_with_turn,
    session_quota_check,
    step_transition,
    turn_create,
    turn_transition,
)

MAX_TOOL_OUTPUT_CHARS = 1_000_000
# The budgets as the dashboard's form names them.
BUDGET_LABELS = {"max_tool_calls": "Tool calls", "max_model_calls": "Model calls", "max_tokens": "Tokens",
                 "max_wall_seconds": "Wall seconds"}


def session_start(*, agent: AgentProfile, owner: User, input: str = "", title: str = "",
                  pinned: dict[str, Any] | None = None, budget: dict[str, Any] | None = None,
                  metadata: dict[str, Any] | None = None,
                  idempotency_key: str = "") -> tuple[AgentSession, Turn | None]:
    """Create a session and, with input, its first turn; the engine starts after commit. 429
    while the owner has too many sessions working (``session_quota_check``)."""
    if input and not input.strip():
        # Whitespace is not a turn's input; without this guard the title line below was an IndexError (500).
        raise InvalidArguments("input must not be empty or whitespace only", details={"field": "input"})
    session_quota_check(owner=owner)
    if not title and input:
        title = input.strip().splitlines()[0][:80]
    if not input:
        return session_create(agent=agent, owner=owner, title=title, pinned=pinned, budget=budget,
                              metadata=metadata), None
    session, turn = session_create_with_turn(agent=agent, owner=owner, input=input, title=title, pinned=pinned,
                                             budget=budget, metadata=metadata, idempotency_key=idempotency_key)
    dispatch.turn_start_enqueue(turn.id, session_id=turn.session_id)
    return session, turn


@transaction.atomic
def turn_submit(*, session_id: uuid.UUID | str, input: str, actor: User | None = None,
                idempotency_key: str = "") -> Turn:
    """Queue the next input of a session (409 ``turn_active`` while a turn runs)."""
    turn = turn_create(session_id=session_id, input=input, actor=actor, idempotency_key=idempotency_key)
    dispatch.turn_start_enqueue(turn.id, session_id=turn.session_id)
    return turn


class NotRetryable(Conflict):
    """Only the session's latest turn, failed with a retryable error, can be retried."""

    code = "not_retryable"


class BudgetStillExceeded(Conflict):
    """The budget that failed the turn is still used up: a retry would fail again (after asking a
    reviewer, for a tool call)."""

    code = "budget_still_exceeded"


def _budget_still_crossed(turn: Turn, session_id: uuid.UUID) -> Budget | None:
    """The budget named by the turn's last ``budget.exceeded``, when the session's is still used
    up (the retried turn's wall time counts afresh)."""
    exceeded = (Event.objects.filter(turn_id=turn.id, type="budget.exceeded").order_by("-seq")
                .values_list("payload", flat=True).first())
    name = (exceeded or {}).get("budget")
    counters = session_counters(AgentSession.objects.get(pk=session_id))
    for before in ("model", "tool"):
        crossed = budget_crossed(counters, 0.0, before=before)
        if crossed is not None and crossed.name == name:
            return crossed
    return None


@transaction.atomic
def turn_retry(*, turn_id: uuid.UUID | str, actor: User) -> Turn:
    """Run a failed, retryable turn again from where it stopped (its steps are kept: the engine's
    next action is a fresh model call). Records ``turn.retried``; the engine starts after commit.

    Idempotent: a turn already retried (active again) is returned as it is, and woken again. Only
    the session's latest turn (409 ``not_retryable`` otherwise) while no other turn is active.
    Needs the permission to operate sessions.
    """
    require_perm(actor, OPERATE_SESSIONS)
    try:
        session_id = Turn.objects.filter(pk=turn_id).values_list("session_id", flat=True).first()
    except (ValueError, ValidationError) as exc:
        raise NotFound(f"No turn {turn_id}") from exc
    if session_id is None:
        raise NotFound(f"No turn {turn_id}")
    session_lock(session_id)
    turn = Turn.objects.select_for_update().get(pk=turn_id)
    if turn.is_active:
        dispatch.tick_enqueue(turn.id)  # a replay: retried already
        return turn
    if turn.status != Turn.Status.FAILED or not turn.retryable:
        raise NotRetryable(f"This turn is {turn.status}{' (not retryable)' if turn.status == 'failed' else ''}; "
                           "only a failed, retryable turn can be retried.",
                           details={"status": turn.status, "error_code": turn.error_code})
    if Turn.objects.filter(session_id=session_id, index__gt=turn.index).exists():
        raise NotRetryable("A later turn exists; only the latest turn can be retried.")
    if Turn.objects.filter(session_id=session_id, status__in=Turn.ACTIVE).exists():
        raise TurnActive("This session already has an active turn; wait for it or cancel it.")
    crossed = _budget_still_crossed(turn, session_id) if turn.error_code == "budget_exceeded" else None
    if crossed is not None:
        raise BudgetStillExceeded(f"Raise the budget first: {BUDGET_LABELS.get(crossed.name, crossed.name)} is "
                                  f"limited to {crossed.limit} and {crossed.used:g} are used.",
                                  details={"budget": crossed.name, "limit": crossed.limit, "used": crossed.used})
    failure = {"error_code": turn.error_code, "error_message": turn.error_message}
    turn = turn_transition(turn_id=turn.id, session_id=session_id, to=Turn.Status.QUEUED, error_code="",
                           error_message="", retryable=False, finished_at=None)
    # Its wall time so far was added to the session's when it failed: count afresh from the retry.
    Turn.objects.filter(pk=turn.id).update(started_at=None)
    turn.started_at = None
    event_record(session_id=session_id, turn_id=turn.id, type="turn.retried",
                 payload={"index": turn.index, "by": actor.get_username(), **failure})
    dispatch.tick_enqueue(turn.id)
    return turn


@transaction.atomic
def session_cancel(*, session_id: uuid.UUID | str, actor: User | None = None) -> AgentSession:
    """Cancel the session's active turn; a session with no active turn is a no-op."""
    try:
        session_lock(session_id)
        session = AgentSession.objects.get(pk=session_id)
    except (AgentSession.DoesNotExist, ValueError) as exc:
        raise NotFound(f"No session {session_id}") from exc
    turn_id = Turn.objects.filter(session=session, status__in=Turn.ACTIVE).values_list("id", flat=True).first()
    if turn_id is None:
        return session
    turn_cancel(turn_id=turn_id, actor=actor)
    session.refresh_from_db()
    return session


@transaction.atomic
def tool_output_submit(*, session_id: uuid.UUID | str, call_id: str, output: Any, success: bool = True,
                       turn_id: uuid.UUID | str | None = None) -> Step:
    """The integration's result for a client tool call (of ``turn_id`` when given); the turn
    resumes when none is left."""
    try:
        key = uuid.UUID(str(session_id))
        session_lock(key)
        steps = Step.objects.select_for_update().filter(session_id=key, call_id=call_id, kind=Step.Kind.TOOL)
        if turn_id is not None:
            steps = steps.filter(turn_id=uuid.UUID(str(turn_id)))
        step = steps.order_by("-created_at").first()
    except ValueError as exc:
        raise NotFound(f"No session {session_id}" if turn_id is None else f"No tool call {call_id!r}") from exc
    if step is None:
        raise NotFound(f"No tool call {call_id!r} in this session", details={"call_id": call_id})
    text = output if isinstance(output, str) else json.dumps(output)
    if len(text) > MAX_TOOL_OUTPUT_CHARS:
        raise InvalidArguments(f"The output is over {MAX_TOOL_OUTPUT_CHARS:,} characters.", details={"field": "output"})
    result = {"status": "completed" if success else "failed", "output": text,
              "error_code": "" if success else "client_error"}
    if step.status in (Step.Status.COMPLETED, Step.Status.FAILED):
        if step.result == result:
            dispatch.tick_enqueue(step.turn_id)  # a replay changes nothing but re-wakes a turn whose wake-up was lost
            return step
        raise Conflict("This tool call already has an output.", code="already_submitted")
    if step.status != Step.Status.RUNNING or step.lease_expires_at is not None or hooks.engine_tool_waits(
            step.tool_name):
        # Only a client tool waits here: a leased step is a command a worker runs.
        raise Conflict(f"This tool call is {step.status}; it does not wait for an output.", code="not_waiting")
    step = step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.COMPLETED if success
                           else Step.Status.FAILED, event_type="tool.completed" if success else "tool.failed",
                           event_payload={"result": result, "client": True}, result=result,
                           error_code=result["error_code"])
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="tool.output_submitted",
                 payload={"call_id": call_id, "success": success})
    dispatch.tick_enqueue(step.turn_id)
    return step
