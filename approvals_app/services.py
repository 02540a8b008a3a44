"""Approval requests: create, decide (by request ID only), expire, cancel, consume; grants."""

import contextlib
import hashlib
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from agentops.domain import Conflict, InvalidArguments, NotFound, PermissionDenied, joins_transaction
from approvals_app.models import ApprovalGrant, ApprovalRequest
from approvals_app.signals import approval_decided
from sessions_app.models import Step
from sessions_app.services import canonical_json, event_record, locked_with_session, step_transition
from tools_app.builtin import validate_arguments
from tools_app.models import ToolDefinition

DECIDE_PERMISSION = "approvals_app.decide_approvalrequest"
TOOL_DECISIONS = {"approve", "reject"}
RECOVERY_DECISIONS = {"retry", "mark_done", "fail"}


class StaleArguments(Conflict):
    """The arguments changed since the reviewer saw them; reload and decide again."""

    code = "stale_arguments"


class AlreadyDecided(Conflict):
    """This request was already decided differently."""

    code = "already_decided"


def arguments_hash(*, tool_name: str, arguments: Any, sandbox_backend: str = "", network_policy: str = "") -> str:
    """SHA-256 of the canonical JSON of what is being approved: tool, arguments, sandbox policy."""
    doc = {"tool": tool_name, "arguments": arguments,
           "sandbox": {"backend": sandbox_backend, "network": network_policy}}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def _public(approval: ApprovalRequest) -> dict[str, Any]:
    return {"request_id": str(approval.request_id), "kind": approval.kind, "tool": approval.tool_name,
            "status": approval.status, "arguments_sha256": approval.arguments_sha256,
            "approval_mode": approval.approval_mode, "risk": approval.risk}


@joins_transaction
def approval_request_create(*, step_id: uuid.UUID | str, kind: str = ApprovalRequest.Kind.TOOL,
                            risk: str = "high", risk_note: str = "", sandbox_backend: str = "",
                            network_policy: str = "", preview: str = "",
                            ttl_seconds: int | None = None) -> ApprovalRequest:
    """Ask a reviewer about one step. Idempotent: a pending request for the step is returned.

    Moves a tool step to ``awaiting_approval`` (a recovery request leaves it ``in_doubt``).
    """
    step = locked_with_session(Step.objects.all(), pk=step_id)
    existing = ApprovalRequest.objects.filter(step=step, kind=kind, status=ApprovalRequest.Status.PENDING).first()
    if existing is not None:
        return existing
    ttl = ttl_seconds if ttl_seconds is not None else settings.AGENTOPS_APPROVAL_TTL_SECONDS
    approval = ApprovalRequest.objects.create(
        kind=kind, session_id=step.session_id, turn_id=step.turn_id, step=step, tool_name=step.tool_name,
        arguments=step.arguments, approval_mode=step.approval_mode or "mutating", risk=risk, risk_note=risk_note,
        sandbox_backend=sandbox_backend, network_policy=network_policy, preview=preview,
        arguments_sha256=arguments_hash(tool_name=step.tool_name, arguments=step.arguments,
                                        sandbox_backend=sandbox_backend, network_policy=network_policy),
        expires_at=timezone.now() + timedelta(seconds=ttl) if ttl else None,
    )
    if kind == ApprovalRequest.Kind.TOOL:
        step_transition(step_id=step.id, to=Step.Status.AWAITING_APPROVAL)
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="approval.requested",
                 payload={**_public(approval), "arguments": approval.arguments, "risk_note": risk_note,
                          "network_policy": network_policy, "sandbox_backend": sandbox_backend,
                          "expires_at": approval.expires_at.isoformat() if approval.expires_at else None})
    return approval


def _validate_edited(tool_name: str, arguments: Any) -> None:
    if not isinstance(arguments, dict):
        raise InvalidArguments("Edited arguments must be a JSON object", details={"field": "arguments"})
    tool = ToolDefinition.objects.filter(name=tool_name).first()
    if tool is None:
        return
    errors = validate_arguments(tool_name, tool.parameters_schema, arguments)
    if errors:
        raise InvalidArguments("Edited arguments do not match the tool's schema", details={"errors": errors})


def _check_actor(approval: ApprovalRequest, actor: User) -> None:
    if not actor.is_active or not actor.has_perm(DECIDE_PERMISSION):
        raise PermissionDenied("You need the permission to decide approval requests.")
    if settings.AGENTOPS_FORBID_SELF_APPROVAL and approval.session.owner_id == actor.pk:
        raise PermissionDenied("You started this session; another reviewer must decide its requests.",
                               code="self_approval_forbidden")


def approval_decide(*, request_id: uuid.UUID | str, actor: User, decision: str, reason: str = "",
                    seen_hash: str | None = None, arguments: dict[str, Any] | None = None,
                    remember: bool = False) -> ApprovalRequest:
    """Record a reviewer's decision. Idempotent for the same decision; 409 otherwise.

    Wakes the engine (``approval_decided``) after commit. A request past its deadline that the
    sweeper has not reached yet is expired first, in its own transaction, so the refusal
    (409 ``expired``) does not roll the expiry back.
    """
    with contextlib.suppress(ValueError, ValidationError):
        due = ApprovalRequest.objects.filter(request_id=request_id, status="pending",
                                             expires_at__lte=timezone.now()).values_list("pk", flat=True)
        for pk in due:
            _expire_one(pk)
    return _approval_decide(request_id=request_id, actor=actor, decision=decision, reason=reason,
                            seen_hash=seen_hash, arguments=arguments, remember=remember)


@transaction.atomic
def _approval_decide(*, request_id: uuid.UUID | str, actor: User, decision: str, reason: str,
                     seen_hash: str | None, arguments: dict[str, Any] | None, remember: bool) -> ApprovalRequest:
    try:
        approval = locked_with_session(ApprovalRequest.objects.select_related("session"), request_id=request_id)
    except (ApprovalRequest.DoesNotExist, ValueError, ValidationError) as exc:
        raise NotFound(f"No approval request {request_id}") from exc
    _check_actor(approval, actor)
    allowed = TOOL_DECISIONS if approval.kind == ApprovalRequest.Kind.TOOL else RECOVERY_DECISIONS
    if decision not in allowed:
        raise InvalidArguments(f"A {approval.kind} request takes one of {sorted(allowed)}",
                               details={"field": "decision", "allowed": sorted(allowed)})
    if approval.decision == decision and approval.status != ApprovalRequest.Status.PENDING:
        return approval  # a replay (double click) changes nothing
    if approval.status != ApprovalRequest.Status.PENDING:
        if approval.status == ApprovalRequest.Status.EXPIRED:
            raise Conflict("This request expired before it was decided.", code="expired")
        raise AlreadyDecided(f"This request is already {approval.status} ({approval.decision or 'no decision'}).",
                             details={"status": approval.status, "decision": approval.decision})
    if approval.expires_at and approval.expires_at <= timezone.now():
        # It came due a moment ago: refuse; the sweeper records the expiry.
        raise Conflict("This request expired before it was decided.", code="expired")
    if seen_hash is not None and seen_hash != approval.arguments_sha256:
        raise StaleArguments(details={"current_sha256": approval.arguments_sha256, "seen_sha256": seen_hash})
    if arguments is not None:
        if decision != "approve":
            raise InvalidArguments("Only an approval can carry edited arguments", details={"field": "arguments"})
        _validate_edited(approval.tool_name, arguments)
        if arguments == approval.arguments:
            arguments = None
    if remember and (decision != "approve" or approval.approval_mode != "confirm_once"):
        raise InvalidArguments("remember applies only to approving a confirm_once tool",
                               details={"field": "remember"})

    status = (ApprovalRequest.Status.APPROVED if decision in ("approve", "retry", "mark_done")
              else ApprovalRequest.Status.REJECTED)
    approval.status = status
    approval.decision = decision
    approval.decided_by = actor
    approval.decided_at = timezone.now()
    approval.reason = reason
    approval.seen_sha256 = seen_hash or ""
    approval.edited_arguments = arguments
    approval.remember = remember
    approval.save(update_fields=["status", "decision", "decided_by", "decided_at", "reason", "seen_sha256",
                                 "edited_arguments", "remember", "updated_at"])
    _apply_to_step(approval)
    if remember:
        ApprovalGrant.objects.get_or_create(session_id=approval.session_id, tool_name=approval.tool_name,
                                            defaults={"granted_by": actor, "source_request": approval})
    event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                 type="approval.decided",
                 payload={**_public(approval), "decision": decision, "reason": reason,
                          "decided_by": actor.get_username(), "edited_arguments": arguments,
                          "remember": remember})
    _wake_engine(approval)
    return approval


def _apply_to_step(approval: ApprovalRequest) -> None:
    step_id, decision = approval.step_id, approval.decision
    if decision == "approve":
        fields: dict[str, Any] = {}
        if approval.edited_arguments is not None:
            fields["arguments"] = approval.edited_arguments
        step_transition(step_id=step_id, to=Step.Status.APPROVED, **fields)
    elif decision == "reject":
        note = f"The reviewer rejected this call. Reason: {approval.reason or '(none given)'}"
        step_transition(step_id=step_id, to=Step.Status.REJECTED, event_type="tool.rejected",
                        event_payload={"reason": approval.reason},
                        result={"status": "rejected", "output": note}, error_code="rejected")
    elif decision == "retry":
        step_transition(step_id=step_id, to=Step.Status.APPROVED, event_type="tool.retry_approved")
    elif decision == "mark_done":
        note = f"A reviewer marked this call as done after a crash. {approval.reason}".strip()
        step_transition(step_id=step_id, to=Step.Status.COMPLETED, event_type="tool.completed",
                        event_payload={"marked_done": True},
                        result={"status": "ok", "output": note, "marked_done": True})
    elif decision == "fail":
        note = f"A reviewer failed this call after a crash. {approval.reason}".strip()
        step_transition(step_id=step_id, to=Step.Status.FAILED, event_type="tool.failed",
                        result={"status": "error", "output": note, "error_code": "in_doubt_failed"},
                        error_code="in_doubt_failed", error_message=note)


def _wake_engine(approval: ApprovalRequest) -> None:
    kwargs = {"request_id": approval.request_id, "turn_id": approval.turn_id, "step_id": approval.step_id,
              "status": approval.status}
    transaction.on_commit(lambda: approval_decided.send(sender=ApprovalRequest, **kwargs))


def _expire(approval: ApprovalRequest) -> None:
    approval.status = ApprovalRequest.Status.EXPIRED
    approval.save(update_fields=["status", "updated_at"])
    if approval.kind == ApprovalRequest.Kind.TOOL:
        note = "The approval request expired before a reviewer decided; the call did not run."
        step_transition(step_id=approval.step_id, to=Step.Status.EXPIRED, event_type="tool.expired",
                        result={"status": "expired", "output": note}, error_code="expired")
    event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                 type="approval.expired", payload=_public(approval))
    _wake_engine(approval)


def approval_expire_due(*, now: Any = None) -> int:
    """Expire every pending request past its deadline. Returns how many expired."""
    now = now or timezone.now()
    count = 0
    for pk in ApprovalRequest.objects.filter(status="pending", expires_at__lte=now).values_list("pk", flat=True):
        count += _expire_one(pk)
    return count


@transaction.atomic
def _expire_one(pk: int) -> int:
    approval = locked_with_session(ApprovalRequest.objects.all(), pk=pk)
    if approval.status != ApprovalRequest.Status.PENDING:
        return 0
    _expire(approval)
    return 1


@joins_transaction
def approval_consume(*, request_id: uuid.UUID | str) -> ApprovalRequest:
    """Mark an approved request as used, exactly once; re-check the hash of what was approved.

    Raises Conflict when it was consumed already: the caller must not run the tool again.
    """
    approval = locked_with_session(ApprovalRequest.objects.all(), request_id=request_id)
    if approval.status != ApprovalRequest.Status.APPROVED:
        raise Conflict(f"Approval {request_id} is {approval.status}, not approved", code="not_approved")
    expected = arguments_hash(tool_name=approval.tool_name, arguments=approval.arguments,
                              sandbox_backend=approval.sandbox_backend, network_policy=approval.network_policy)
    if expected != approval.arguments_sha256:
        raise StaleArguments("The approved arguments were altered after the decision.")
    approval.ensure_can_move_to(ApprovalRequest.Status.CONSUMED)
    approval.status = ApprovalRequest.Status.CONSUMED
    approval.consumed_at = timezone.now()
    approval.save(update_fields=["status", "consumed_at", "updated_at"])
    return approval


@joins_transaction
def approval_transition(*, request_id: uuid.UUID | str, to: str) -> ApprovalRequest:
    """Generic guarded move (used for cancel); decisions go through ``approval_decide``."""
    approval = locked_with_session(ApprovalRequest.objects.all(), request_id=request_id)
    if approval.status == to:
        return approval
    approval.ensure_can_move_to(to)
    approval.status = to
    approval.save(update_fields=["status", "updated_at"])
    return approval


def approvals_cancel_for_turn(*, turn_id: uuid.UUID | str) -> int:
    """Cancel the open requests of a turn (the turn was cancelled). Call inside atomic()."""
    count = 0
    for approval in ApprovalRequest.objects.select_for_update().filter(
            turn_id=turn_id, status__in=[ApprovalRequest.Status.PENDING, ApprovalRequest.Status.APPROVED]):
        approval_transition(request_id=approval.request_id, to=ApprovalRequest.Status.CANCELLED)
        event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                     type="approval.cancelled", payload={**_public(approval), "status": "cancelled"})
        count += 1
    return count


def grant_is_live(*, session_id: uuid.UUID | str, tool_name: str) -> bool:
    now = timezone.now()
    grants = ApprovalGrant.objects.filter(session_id=uuid.UUID(str(session_id)), tool_name=tool_name,
                                          revoked_at__isnull=True)
    return grants.exclude(expires_at__lte=now).exists()

