"""The sweeper: expired approvals, expired leases, and turns whose next tick was lost.

A mutating tool is never blindly replayed: its effect is checked first. The outbox dedupes
send_email by idempotency key; a command that ran without network is retried only when the
workspace is unchanged since the manifest taken before it started; otherwise the step is
``in_doubt`` and a reviewer decides (retry, mark done, fail).
"""

import logging
import uuid
from datetime import datetime, timedelta
from pathlib import Path

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from agentops import dispatch
from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_expire_due, approval_request_create
from sessions_app.engine.turns import turn_fail
from sessions_app.events import event_record
from sessions_app.locks import session_lock
from sessions_app.models import Step, Turn
from sessions_app.services import step_transition
from tools_app.models import NetworkPolicy, ToolDefinition
from tools_app.sandbox import workspace_changed_since

log = logging.getLogger(__name__)

MODEL_MAX_ATTEMPTS = 3
STALE_TURN_SECONDS = 30


def sweep() -> dict[str, int]:
    """One pass of the sweeper (Celery beat runs it every ``AGENTOPS_SWEEP_SECONDS``)."""
    counts = {"approvals_expired": approval_expire_due(), "steps_recovered": 0, "turns_kicked": 0}
    now = timezone.now()
    for step_id in Step.objects.filter(status=Step.Status.RUNNING, lease_expires_at__lt=now).values_list(
            "pk", flat=True):
        if step_recover(step_id):
            counts["steps_recovered"] += 1
    for turn_id in turns_to_kick(now=now):
        dispatch.tick_enqueue(turn_id)
        counts["turns_kicked"] += 1
    return counts


def turns_to_kick(*, now: datetime) -> list[uuid.UUID]:
    """Turns whose next tick was lost (Redis down between a commit and its hand-off, a worker killed
    holding the task) and that went quiet: queued or running ones, and waiting ones whose wait is
    over: an approved call (a decision's tick lost) or nothing left waiting for a reviewer or a
    client (a client tool's answer, a recovery decision). A tick is idempotent: a needless one does
    nothing. Turns that really wait (a pending approval, a client tool unanswered) are left alone,
    so thousands of waiting turns cost no tick each sweep."""
    quiet = now - timedelta(seconds=STALE_TURN_SECONDS)
    steps = Step.objects.filter(turn=OuterRef("pk"))
    approved = steps.filter(status=Step.Status.APPROVED)
    waiting = steps.filter(status__in=[Step.Status.AWAITING_APPROVAL, Step.Status.IN_DOUBT, Step.Status.RUNNING])
    moving = Q(status__in=[Turn.Status.QUEUED, Turn.Status.RUNNING])
    waited_out = Q(status__in=[Turn.Status.AWAITING_APPROVAL, Turn.Status.REQUIRES_ACTION]) & (
        Exists(approved) | ~Exists(waiting))
    return list(Turn.objects.filter(moving | waited_out, updated_at__lt=quiet).values_list("pk", flat=True))


def step_recover(step_id: uuid.UUID | str) -> bool:
    """Decide what to do with one step whose lease expired. Returns True when it changed."""
    session_id = Step.objects.filter(pk=step_id).values_list("session_id", flat=True).first()
    if session_id is None:
        return False
    with transaction.atomic():
        session_lock(session_id)
        step = Step.objects.select_for_update().filter(pk=step_id).first()
        if step is None or step.status != Step.Status.RUNNING or step.lease_expires_at is None \
                or step.lease_expires_at >= timezone.now():
            return False
        outcome = _recover(step)
        log.warning("recovering step %s (%s %s, attempt %d): %s", step.id, step.kind, step.tool_name,
                    step.attempts, outcome)
        event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="step.recovered",
                     payload={"kind": step.kind, "tool": step.tool_name, "attempts": step.attempts,
                              "outcome": outcome})
        dispatch.tick_enqueue(step.turn_id)
    return True


def _back_to(step: Step, to: str) -> None:
    step_transition(step_id=step.id, session_id=step.session_id, to=to, lease_owner="", lease_expires_at=None)


def _recover(step: Step) -> str:
    """Retry, fail or ask a reviewer, by what is known of the step's effect."""
    if step.kind == Step.Kind.MODEL:
        if step.attempts >= MODEL_MAX_ATTEMPTS:
            message = "The model call kept dying."
            step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.FAILED,
                            event_type="model.failed", error_code="model_unavailable", error_message=message)
            turn_fail(turn_id=step.turn_id, code="model_unavailable", message=message, retryable=True)
            return "failed"
        _back_to(step, Step.Status.PLANNED)
        return "retry"  # model calls have no side effects
    tool = ToolDefinition.objects.filter(name=step.tool_name).first()
    if step.attempts >= (tool.max_attempts if tool else 1):
        return _in_doubt(step, "The call was interrupted too often; its outcome is unknown.")
    if tool is not None and tool.idempotent:
        # Re-running gives the same effect (read-only tools, write_file, send_email via the
        # outbox's unique idempotency key).
        _back_to(step, Step.Status.APPROVED)
        return "retry"
    workspace = Path(step.session.workspace) if step.session.workspace else None
    if tool is None or tool.network != NetworkPolicy.NONE or workspace is None:
        return _in_doubt(step, "The worker died while the call ran; it may have reached the network, so its "
                               "effect is unknown.")
    # The manifest is saved before the command starts: without it nothing ran.
    if step.manifest is None or not workspace_changed_since(workspace, step.manifest):
        _back_to(step, Step.Status.APPROVED)
        return "retry"
    return _in_doubt(step, "The worker died while the command ran and the workspace changed since it started.")


def _in_doubt(step: Step, note: str) -> str:
    step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.IN_DOUBT, event_type="tool.in_doubt",
                    lease_owner="", lease_expires_at=None, event_payload={"reason": note})
    approval_request_create(step_id=step.id, kind=ApprovalRequest.Kind.RECOVERY, risk="high", risk_note=note,
                            ttl_seconds=0)
    return "in_doubt"
