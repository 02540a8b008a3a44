"""Approval requests: create, decide (by request ID only), expire, cancel, consume; grants.

Every status write goes through ``_move``, the guarded transition (locked row, ``TRANSITIONS``
checked). A decision wakes the engine after commit through ``agentops.dispatch``.
"""

import hashlib
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from agentops import dispatch
from agentops.domain import Conflict, InvalidArguments, NotFound, PermissionDenied, canonical_json, joins_transaction
from agentops.permissions import DECIDE_APPROVALS
from approvals_app.models import ApprovalGrant, ApprovalRequest
from sessions_app.events import event_record
from sessions_app.locks import locked_with_session
from sessions_app.models import Step, Turn
from sessions_app.services import step_transition
from tools_app.builtin import validate_arguments
from tools_app.models import ApprovalMode, ToolDefinition

Decision = ApprovalRequest.Decision
Status = ApprovalRequest.Status
TOOL_DECISIONS = frozenset({Decision.APPROVE, Decision.REJECT})
RECOVERY_DECISIONS = frozenset({Decision.RETRY, Decision.MARK_DONE, Decision.FAIL})
STATUS_OF_DECISION = {Decision.APPROVE: Status.APPROVED, Decision.RETRY: Status.APPROVED,
                      Decision.MARK_DONE: Status.APPROVED, Decision.REJECT: Status.REJECTED,
                      Decision.FAIL: Status.REJECTED}


class StaleArguments(Conflict):
    """The arguments changed since the reviewer saw them; reload and decide again."""

    code = "stale_arguments"


class AlreadyDecided(Conflict):
    """This request was already decided differently."""

    code = "already_decided"


class Expired(Conflict):
    """This request expired before it was decided."""

    code = "expired"


def arguments_hash(*, tool_name: str, arguments: Any, sandbox_backend: str = "", network_policy: str = "") -> str:
    """SHA-256 of the canonical JSON of what is being approved: tool, arguments, sandbox policy."""
    doc = {"tool": tool_name, "arguments": arguments,
           "sandbox": {"backend": sandbox_backend, "network": network_policy}}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def _public(approval: ApprovalRequest) -> dict[str, Any]:
    return {"request_id": str(approval.request_id), "kind": approval.kind, "tool": approval.tool_name,
            "status": approval.status, "arguments_sha256": approval.arguments_sha256,
            "approval_mode": approval.approval_mode, "risk": approval.risk}


def _move(approval: ApprovalRequest, to: str, **fields: Any) -> None:
    """The guarded transition of a request locked by the caller (session, then request)."""
    approval.ensure_can_move_to(to)
    approval.status = to
    for name, value in fields.items():
        setattr(approval, name, value)
    approval.save(update_fields=["status", "updated_at", *fields])


@joins_transaction
def approval_transition(*, request_id: uuid.UUID | str, to: str) -> ApprovalRequest:
    """Lock and move one request; a no-op when it is there already. Decisions, expiry and
    consumption have their own services (they move the step too)."""
    approval = locked_with_session(ApprovalRequest.objects.all(), request_id=request_id)
    if approval.status != to:
        _move(approval, to)
    return approval


@joins_transaction
def approval_request_create(*, step_id: uuid.UUID | str, kind: str = ApprovalRequest.Kind.TOOL,
                            risk: str = "high", risk_note: str = "", sandbox_backend: str = "",
                            network_policy: str = "", preview: str = "",
                            ttl_seconds: int | None = None) -> ApprovalRequest:
    """Ask a reviewer about one step. Idempotent: a pending request for the step is returned.

    Moves a tool step to ``awaiting_approval`` (a recovery request leaves it ``in_doubt``).
    """
    step = locked_with_session(Step.objects.all(), pk=step_id)
    existing = ApprovalRequest.objects.filter(step=step, kind=kind, status=Status.PENDING).first()
    if existing is not None:
        return existing
    ttl = ttl_seconds if ttl_seconds is not None else settings.AGENTOPS_APPROVAL_TTL_SECONDS
    approval = ApprovalRequest.objects.create(
        kind=kind, session_id=step.session_id, turn_id=step.turn_id, step=step, tool_name=step.tool_name,
        arguments=step.arguments, approval_mode=step.approval_mode or ApprovalMode.MUTATING, risk=risk,
        risk_note=risk_note, sandbox_backend=sandbox_backend, network_policy=network_policy, preview=preview,
        arguments_sha256=arguments_hash(tool_name=step.tool_name, arguments=step.arguments,
                                        sandbox_backend=sandbox_backend, network_policy=network_policy),
        expires_at=timezone.now() + timedelta(seconds=ttl) if ttl else None,
    )
    if kind == ApprovalRequest.Kind.TOOL:
        step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.AWAITING_APPROVAL)
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
    if not actor.is_active or not actor.has_perm(DECIDE_APPROVALS):
        raise PermissionDenied("You need the permission to decide approval requests.")
    if settings.AGENTOPS_FORBID_SELF_APPROVAL and approval.session.owner_id == actor.pk:
        raise PermissionDenied("You started this session; another reviewer must decide its requests.",
                               code="self_approval_forbidden")


def approval_decide(*, request_id: uuid.UUID | str, actor: User, decision: str, reason: str = "",
                    seen_hash: str | None = None, arguments: dict[str, Any] | None = None,
                    remember: bool = False) -> ApprovalRequest:
    """Record a reviewer's decision. Idempotent for the same decision; 409 otherwise.

    Wakes the engine after commit. A request past its deadline that the sweeper has not reached
    yet is expired first, in its own transaction, so the refusal (409 ``expired``) does not roll
    the expiry back.
    """
    try:
        key = uuid.UUID(str(request_id))
    except ValueError as exc:
        raise NotFound(f"No approval request {request_id}") from exc
    for pk in ApprovalRequest.objects.filter(request_id=key, status=Status.PENDING,
                                             expires_at__lte=timezone.now()).values_list("pk", flat=True):
        _expire_one(pk)
    return _decide(request_id=key, actor=actor, decision=decision, reason=reason, seen_hash=seen_hash,
                   arguments=arguments, remember=remember)


@transaction.atomic
def _decide(*, request_id: uuid.UUID, actor: User, decision: str, reason: str, seen_hash: str | None,
            arguments: dict[str, Any] | None, remember: bool) -> ApprovalRequest:
    try:
        approval = locked_with_session(ApprovalRequest.objects.select_related("session"), request_id=request_id)
    except (ApprovalRequest.DoesNotExist, ValidationError) as exc:
        raise NotFound(f"No approval request {request_id}") from exc
    _check_actor(approval, actor)
    allowed = TOOL_DECISIONS if approval.kind == ApprovalRequest.Kind.TOOL else RECOVERY_DECISIONS
    if decision not in allowed:
        raise InvalidArguments(f"A {approval.kind} request takes one of {sorted(allowed)}",
                               details={"field": "decision", "allowed": sorted(allowed)})
    if approval.decision == decision and approval.status != Status.PENDING:
        # A replay (double click, a client retrying) changes nothing, but wakes the engine again:
        # the first decision's wake-up may have been lost (Redis down), and a tick is idempotent.
        dispatch.tick_enqueue(approval.turn_id)
        return approval
    if approval.status == Status.EXPIRED:
        raise Expired()
    if approval.status != Status.PENDING:
        raise AlreadyDecided(f"This request is already {approval.status} ({approval.decision or 'no decision'}).",
                             details={"status": approval.status, "decision": approval.decision})
    if approval.expires_at and approval.expires_at <= timezone.now():
        raise Expired()  # it came due a moment ago; the sweeper records the expiry
    if seen_hash is not None and seen_hash != approval.arguments_sha256:
        raise StaleArguments(details={"current_sha256": approval.arguments_sha256, "seen_sha256": seen_hash})
    if arguments is not None:
        if decision != Decision.APPROVE:
            raise InvalidArguments("Only an approval can carry edited arguments", details={"field": "arguments"})
        _validate_edited(approval.tool_name, arguments)
        if arguments == approval.arguments:
            arguments = None
    if remember and (decision != Decision.APPROVE or approval.approval_mode != ApprovalMode.CONFIRM_ONCE):
        raise InvalidArguments("remember applies only to approving a confirm_once tool",
                               details={"field": "remember"})

    _move(approval, STATUS_OF_DECISION[Decision(decision)], decision=decision, decided_by=actor,
          decided_at=timezone.now(), reason=reason, seen_sha256=seen_hash or "", edited_arguments=arguments,
          remember=remember)
    _apply_to_step(approval)
    if remember:
        ApprovalGrant.objects.get_or_create(session_id=approval.session_id, tool_name=approval.tool_name,
                                            defaults={"granted_by": actor, "source_request": approval})
    event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                 type="approval.decided",
                 payload={**_public(approval), "decision": decision, "reason": reason,
                          "decided_by": actor.get_username(), "edited_arguments": arguments,
                          "remember": remember})
    dispatch.tick_enqueue(approval.turn_id)
    return approval


def _apply_to_step(approval: ApprovalRequest) -> None:
    """Move the step the decision is about (its session is locked already)."""
    move: dict[str, Any] = {"step_id": approval.step_id, "session_id": approval.session_id}
    match approval.decision:
        case Decision.APPROVE:
            edited = {} if approval.edited_arguments is None else {"arguments": approval.edited_arguments}
            step_transition(**move, to=Step.Status.APPROVED, **edited)
        case Decision.REJECT:
            note = f"The reviewer rejected this call. Reason: {approval.reason or '(none given)'}"
            step_transition(**move, to=Step.Status.REJECTED, event_type="tool.rejected",
                            event_payload={"reason": approval.reason},
                            result={"status": "rejected", "output": note}, error_code="rejected")
        case Decision.RETRY:
            step_transition(**move, to=Step.Status.APPROVED, event_type="tool.retry_approved")
        case Decision.MARK_DONE:
            note = f"A reviewer marked this call as done after a crash. {approval.reason}".strip()
            step_transition(**move, to=Step.Status.COMPLETED, event_type="tool.completed",
                            event_payload={"marked_done": True},
                            result={"status": "completed", "output": note, "marked_done": True})
        case Decision.FAIL:
            note = f"A reviewer failed this call after a crash. {approval.reason}".strip()
            step_transition(**move, to=Step.Status.FAILED, event_type="tool.failed",
                            result={"status": "failed", "output": note, "error_code": "in_doubt_failed"},
                            error_code="in_doubt_failed", error_message=note)


def approval_expire_due(*, now: Any = None) -> int:
    """Expire every pending request past its deadline. Returns how many expired."""
    now = now or timezone.now()
    due = ApprovalRequest.objects.filter(status=Status.PENDING, expires_at__lte=now).values_list("pk", flat=True)
    return sum(_expire_one(pk) for pk in due)


@transaction.atomic
def _expire_one(pk: int) -> int:
    approval = locked_with_session(ApprovalRequest.objects.all(), pk=pk)
    if approval.status != Status.PENDING:
        return 0
    _move(approval, Status.EXPIRED)
    if approval.kind == ApprovalRequest.Kind.TOOL:
        note = "The approval request expired before a reviewer decided; the call did not run."
        step_transition(step_id=approval.step_id, session_id=approval.session_id, to=Step.Status.EXPIRED,
                        event_type="tool.expired", result={"status": "expired", "output": note}, error_code="expired")
    event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                 type="approval.expired", payload=_public(approval))
    dispatch.tick_enqueue(approval.turn_id)
    return 1


@joins_transaction
def approval_consume(*, request_id: uuid.UUID | str) -> ApprovalRequest:
    """Mark an approved request as used, exactly once; re-check the hash of what was approved.

    Raises Conflict when it is not approved (consumed already: the caller must not run the tool
    again) and StaleArguments when the approved row no longer matches its hash.
    """
    approval = locked_with_session(ApprovalRequest.objects.all(), request_id=request_id)
    if approval.status != Status.APPROVED:
        raise Conflict(f"Approval {request_id} is {approval.status}, not approved", code="not_approved")
    expected = arguments_hash(tool_name=approval.tool_name, arguments=approval.arguments,
                              sandbox_backend=approval.sandbox_backend, network_policy=approval.network_policy)
    if expected != approval.arguments_sha256:
        raise StaleArguments("The approved arguments were altered after the decision.")
    _move(approval, Status.CONSUMED, consumed_at=timezone.now())
    return approval


@joins_transaction
def approval_cancel_open(*, turn_id: uuid.UUID | str) -> int:
    """Cancel the open (pending or approved, not yet consumed) requests of a turn that ends."""
    turn = locked_with_session(Turn.objects.all(), pk=turn_id)
    count = 0
    for approval in ApprovalRequest.objects.select_for_update().filter(
            turn=turn, status__in=[Status.PENDING, Status.APPROVED]):
        _move(approval, Status.CANCELLED)
        event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                     type="approval.cancelled", payload=_public(approval))
        count += 1
    return count
