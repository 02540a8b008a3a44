"""The sweeper: expired approvals, expired leases, and turns whose next tick was lost.

A mutating tool is never blindly replayed: its effect is checked first. The outbox dedupes
send_email by idempotency key; a command that ran without network is retried only when the
workspace is unchanged since the manifest taken before it started; otherwise the step is
``in_doubt`` and a reviewer decides (retry, mark done, fail).
"""

import logging
import uuid
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_expire_due, approval_request_create
from sessions_app.engine.state import turn_fail
from sessions_app.models import Step, Turn
from sessions_app.services import event_record, session_lock, step_transition
from tools_app.models import ToolDefinition
from tools_app.sandbox import workspace_changed_since

log = logging.getLogger(__name__)

MODEL_MAX_ATTEMPTS = 3
STALE_TURN_SECONDS = 30


def sweep() -> dict[str, int]:
    from sessions_app.tasks import turn_advance_task

    counts = {"approvals_expired": approval_expire_due(), "steps_recovered": 0, "turns_kicked": 0}
    now = timezone.now()
    for step_id in Step.objects.filter(status=Step.Status.RUNNING, lease_expires_at__lt=now).values_list(
            "pk", flat=True):
        if recover_step(step_id):
            counts["steps_recovered"] += 1
    # A tick lost between commit and enqueue (Redis down then): poke turns that went quiet.
    quiet = now - timedelta(seconds=STALE_TURN_SECONDS)
    for turn_id in Turn.objects.filter(status__in=[Turn.Status.QUEUED, Turn.Status.RUNNING],
                                       updated_at__lt=quiet).values_list("pk", flat=True):
        turn_advance_task.delay(str(turn_id))
        counts["turns_kicked"] += 1
    return counts


def recover_step(step_id: uuid.UUID | str) -> bool:
    """Decide what to do with one step whose lease expired. Returns True when it changed."""
    from sessions_app.tasks import turn_advance_task

    session_id = Step.objects.filter(pk=step_id).values_list("session_id", flat=True).first()
    if session_id is None:
        return False
    with transaction.atomic():
        session_lock(session_id)
        step = Step.objects.select_for_update().filter(pk=step_id).first()
        if step is None or step.status != Step.Status.RUNNING or step.lease_expires_at is None \
                or step.lease_expires_at >= timezone.now():
            return False
        outcome = _decide(step)
        log.warning("recovering step %s (%s %s, attempt %d): %s", step.id, step.kind, step.tool_name,
                    step.attempts, outcome)
        event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="step.recovered",
                     payload={"kind": step.kind, "tool": step.tool_name, "attempts": step.attempts,
                              "outcome": outcome})
        turn_id = step.turn_id
        transaction.on_commit(lambda: turn_advance_task.delay(str(turn_id)))
    return True


def _decide(step: Step) -> str:
    if step.kind == Step.Kind.MODEL:
        if step.attempts >= MODEL_MAX_ATTEMPTS:
            step_transition(step_id=step.id, to=Step.Status.FAILED, event_type="model.failed",
                            error_code="model_unavailable", error_message="The model call kept dying.")
            turn_fail(turn_id=step.turn_id, code="model_unavailable", message="The model call kept dying.",
                      retryable=True)
            return "failed"
        step_transition(step_id=step.id, to=Step.Status.PLANNED, lease_owner="", lease_expires_at=None)
        return "retry"  # model calls have no side effects
    tool = ToolDefinition.objects.filter(name=step.tool_name).first()
    max_attempts = tool.max_attempts if tool else 1
    if step.attempts >= max_attempts:
        step_transition(step_id=step.id, to=Step.Status.IN_DOUBT, event_type="tool.in_doubt",
                        lease_owner="", lease_expires_at=None)
        _ask_reviewer(step, "The call was interrupted too often; its outcome is unknown.")
        return "in_doubt"
    if tool is not None and tool.idempotent:
        # Re-running gives the same effect (read-only tools, write_file, send_email via the
        # outbox's unique idempotency key).
        step_transition(step_id=step.id, to=Step.Status.APPROVED, lease_owner="", lease_expires_at=None)
        return "retry"
    workspace = Path(step.session.workspace) if step.session.workspace else None
    if tool is not None and tool.network == "none" and workspace is not None:
        if step.manifest is None:
            # The manifest is saved before the command starts: without it nothing ran.
            step_transition(step_id=step.id, to=Step.Status.APPROVED, lease_owner="", lease_expires_at=None)
            return "retry"
        if not workspace_changed_since(workspace, step.manifest):
            step_transition(step_id=step.id, to=Step.Status.APPROVED, lease_owner="", lease_expires_at=None)
            return "retry"
        note = "The worker died while the command ran and the workspace changed since it started."
    else:
        note = "The worker died while the call ran; it may have reached the network, so its effect is unknown."
    step_transition(step_id=step.id, to=Step.Status.IN_DOUBT, event_type="tool.in_doubt", lease_owner="",
                    lease_expires_at=None, event_payload={"reason": note})
    _ask_reviewer(step, note)
    return "in_doubt"


def _ask_reviewer(step: Step, note: str) -> ApprovalRequest:
    return approval_request_create(step_id=step.id, kind=ApprovalRequest.Kind.RECOVERY, risk="high",
                                   risk_note=note, ttl_seconds=0)
