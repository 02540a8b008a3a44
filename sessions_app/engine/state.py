"""Small shared pieces of the engine: claiming steps, failing turns, keeping session status in step."""

import socket
import threading
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from agentops.domain import joins_transaction
from sessions_app.models import AgentSession, Step, Turn
from sessions_app.services import (
    SESSION_RECORD_FIELDS,
    event_record,
    locked_with_session,
    session_lock,
    session_transition,
    turn_transition,
)

TURN_TO_SESSION = {
    Turn.Status.QUEUED: AgentSession.Status.IN_PROGRESS,
    Turn.Status.RUNNING: AgentSession.Status.IN_PROGRESS,
    Turn.Status.AWAITING_APPROVAL: AgentSession.Status.AWAITING_APPROVAL,
    Turn.Status.REQUIRES_ACTION: AgentSession.Status.REQUIRES_ACTION,
    Turn.Status.COMPLETED: AgentSession.Status.IDLE,
    Turn.Status.CANCELLED: AgentSession.Status.IDLE,
    Turn.Status.FAILED: AgentSession.Status.FAILED,
}


def worker_id() -> str:
    return f"{socket.gethostname()}:{threading.get_ident()}"


def turn_move(turn_id: uuid.UUID | str, to: str, **fields: Any) -> Turn:
    """Move a turn and its session together. Call inside atomic()."""
    turn = turn_transition(turn_id=turn_id, to=to, **fields)
    session_transition(session_id=turn.session_id, to=TURN_TO_SESSION[Turn.Status(to)])
    if to in (Turn.Status.COMPLETED, Turn.Status.FAILED, Turn.Status.CANCELLED) and turn.started_at:
        elapsed = (timezone.now() - turn.started_at).total_seconds()
        AgentSession.objects.filter(pk=turn.session_id).update(wall_seconds=F("wall_seconds") + elapsed)
    return turn


@joins_transaction
def turn_fail(*, turn_id: uuid.UUID | str, code: str, message: str, retryable: bool = False) -> Turn | None:
    """Fail an active turn (no-op on a finished one) and settle its open steps."""
    turn = locked_with_session(Turn.objects.all(), pk=turn_id)
    if not turn.is_active:
        return None
    for step in Step.objects.select_for_update().filter(turn_id=turn_id).exclude(status__in=Step.SETTLED):
        _settle_open_step(step, Step.Status.FAILED, code)
    _cancel_approvals(turn.id)
    return turn_move(turn.id, Turn.Status.FAILED, error_code=code, error_message=message[:2000],
                     retryable=retryable)


def _settle_open_step(step: Step, to: str, code: str) -> None:
    from sessions_app.services import step_transition

    if not step.can_move_to(to):  # a step waiting for approval cannot fail: it is cancelled
        to = Step.Status.CANCELLED
    step_transition(step_id=step.id, to=to, error_code=code)


def _cancel_approvals(turn_id: uuid.UUID) -> None:
    from approvals_app.services import approvals_cancel_for_turn

    approvals_cancel_for_turn(turn_id=turn_id)


def session_counters(session: AgentSession) -> dict[str, Any]:
    """The counters and budgets of a session row, as ``session_record`` returns them."""
    return {name: getattr(session, name) for name in SESSION_RECORD_FIELDS}


def budget_exceeded(counters: Mapping[str, Any], started_at: datetime | None, *,
                    before: str) -> tuple[str, int, float] | None:
    """The budget a model call (``before="model"``) or a tool call (``"tool"``) would cross, if any."""
    wall = counters["wall_seconds"] + ((timezone.now() - started_at).total_seconds() if started_at else 0)
    checks: list[tuple[str, int | None, float]] = [
        ("max_tokens", counters["max_tokens"], counters["prompt_tokens"] + counters["completion_tokens"]),
        ("max_wall_seconds", counters["max_wall_seconds"], wall),
    ]
    if before == "model":
        checks.append(("max_model_calls", counters["max_model_calls"], counters["model_calls"]))
    if before == "tool":
        checks.append(("max_tool_calls", counters["max_tool_calls"], counters["tool_calls"]))
    for name, limit, used in checks:
        if limit is not None and used >= limit:
            return name, limit, used
    return None


def lease_seconds_for(timeout_seconds: int) -> float:
    """A lease outlives the longest legitimate run: the tool's timeout plus a margin."""
    return float(timeout_seconds) + float(settings.AGENTOPS_LEASE_SECONDS)


@joins_transaction
def step_claim(*, step_id: uuid.UUID | str, from_status: str, lease_seconds: float, event_type: str,
               event_payload: dict[str, Any] | None = None, known: Step | None = None) -> Step | None:
    """Claim a step for running with a conditional update: exactly one caller wins.

    A redelivered or duplicated task finds the step no longer in ``from_status`` and gets None.
    ``known`` is the row as the caller read it: its fields, but not its status, are trusted.
    """
    session_id = known.session_id if known is not None else (
        Step.objects.filter(pk=step_id).values_list("session_id", flat=True).first())
    if session_id is None:
        return None
    session_lock(session_id)
    now = timezone.now()
    lease = now + timedelta(seconds=lease_seconds)
    claimed = Step.objects.filter(pk=step_id, status=from_status).update(
        status=Step.Status.RUNNING, lease_owner=worker_id(), lease_expires_at=lease,
        attempts=F("attempts") + 1, started_at=now, updated_at=now,
    )
    if not claimed:
        return None
    if known is not None:
        step = known
        step.status, step.lease_owner, step.lease_expires_at = Step.Status.RUNNING, worker_id(), lease
        step.attempts, step.started_at = step.attempts + 1, now
    else:
        step = Step.objects.get(pk=step_id)
    _record_started(step, event_type, event_payload)
    return step


def _record_started(step: Step, event_type: str, event_payload: dict[str, Any] | None = None) -> None:
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type=event_type,
                 payload={"status": "running", "index": step.index, "kind": step.kind, "tool": step.tool_name,
                          "attempt": step.attempts, "arguments": step.arguments if step.kind == "tool" else None,
                          **(event_payload or {})})


def step_create_claimed(*, session: AgentSession, turn: Turn, index: int, lease_seconds: float) -> Step:
    """A new model step, claimed by this worker as it is created. Call under the session lock."""
    now = timezone.now()
    step = Step.objects.create(session=session, turn=turn, index=index, kind=Step.Kind.MODEL,
                               status=Step.Status.RUNNING, lease_owner=worker_id(),
                               lease_expires_at=now + timedelta(seconds=lease_seconds), attempts=1, started_at=now)
    _record_started(step, "model.started")
    return step


def step_is_cancelled(step_id: uuid.UUID | str) -> bool:
    status = Step.objects.filter(pk=step_id).values_list("status", flat=True).first()
    return status in (None, Step.Status.CANCELLED)
