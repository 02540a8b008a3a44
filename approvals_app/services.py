"""Approval requests: create, decide (by request ID only), expire, cancel, consume; grants.

Every status write goes through ``_move``, the guarded transition (locked row, ``TRANSITIONS``
checked). A decision wakes the engine after commit through ``agentops.dispatch``.

The grants a decision may leave behind live in ``grants.py``; the reviewer's workflow around a
decision (policies, conditions, quorum votes, claims, presence, bulk) in modules of their own.
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
from agentops.teams import REVIEW_ROLES, has_team_role, scope
from approvals_app.grants import grant_create, grant_public, validate_pattern
from approvals_app.models import MAX_TTL_SECONDS, ApprovalAudit, ApprovalRequest
from approvals_app.policies import ResolvedPolicy
from approvals_app.quorum import quorum_vote
from approvals_app.signals import approval_changed
from sessions_app.events import event_record
from sessions_app.locks import locked_with_session
from sessions_app.models import Step, Turn
from sessions_app.services import step_transition
from tools_app.binding import run_spec, spec_sha256, with_arguments
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
    """SHA-256 of a call of a tool that has no definition (nothing else to bind)."""
    doc = {"tool": tool_name, "arguments": arguments,
           "sandbox": {"backend": sandbox_backend, "network": network_policy}}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def approval_spec(*, tool_name: str, arguments: Any, sandbox_backend: str | None = None) -> tuple[dict[str, Any], str]:
    """The run spec of a call as it would run now and its hash (``tools_app.binding``)."""
    tool = ToolDefinition.objects.filter(name=tool_name).first()
    if tool is None:
        spec = {"tool": tool_name, "arguments": arguments, "sandbox_backend": sandbox_backend or ""}
        return spec, spec_sha256(spec)
    spec = run_spec(tool=tool, arguments=arguments, sandbox_backend=sandbox_backend)
    return spec, spec_sha256(spec)


def _public(approval: ApprovalRequest) -> dict[str, Any]:
    return {"request_id": str(approval.request_id), "team_id": approval.team_id, "kind": approval.kind,
            "tool": approval.tool_name,
            "status": approval.status, "arguments_sha256": approval.arguments_sha256,
            "approval_mode": approval.approval_mode, "risk": approval.risk,
            "required_approvals": approval.required_approvals, "priority": approval.priority,
            "policy": approval.policy_reason}


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


def _request_mode(step: Step, policy: ResolvedPolicy | None, approval_mode: str | None) -> str:
    """The mode the request is decided under: the gate's (``approval_mode``), else a policy's,
    which replaces the tool's (README), so a policy's ``confirm_once`` can be remembered."""
    for mode in (approval_mode, policy.mode if policy is not None else None):
        if mode in (ApprovalMode.CONFIRM_ONCE, ApprovalMode.MUTATING):
            return str(mode)
    return step.approval_mode or ApprovalMode.MUTATING


@joins_transaction
def approval_request_create(*, step_id: uuid.UUID | str, kind: str = ApprovalRequest.Kind.TOOL,
                            risk: str = "high", risk_note: str = "", sandbox_backend: str = "",
                            network_policy: str = "", preview: str = "",
                            ttl_seconds: int | None = None, policy: ResolvedPolicy | None = None,
                            approval_mode: str | None = None) -> ApprovalRequest:
    """Ask a reviewer about one step. Idempotent: a pending request for the step is returned.

    Moves a tool step to ``awaiting_approval`` (a recovery request leaves it ``in_doubt``).
    ``policy`` (``approval_policy_resolve``): its quorum, reviewer group, TTL and escalation are
    copied onto the request (a later edit of the policy changes no open request).
    """
    step = locked_with_session(Step.objects.all(), pk=step_id)
    existing = ApprovalRequest.objects.filter(step=step, kind=kind, status=Status.PENDING).first()
    if existing is not None:
        return existing
    ttl = ttl_seconds if ttl_seconds is not None else settings.AGENTOPS_APPROVAL_TTL_SECONDS
    if ttl:  # a row written another way than the admin (its validators): at most a year, never an overflow
        ttl = min(int(ttl), MAX_TTL_SECONDS)
    spec, spec_hash = approval_spec(tool_name=step.tool_name, arguments=step.arguments,
                                    sandbox_backend=sandbox_backend or None)
    approval = ApprovalRequest.objects.create(
        kind=kind, session_id=step.session_id, team_id=step.session.team_id, turn_id=step.turn_id, step=step,
        tool_name=step.tool_name,
        arguments=step.arguments, approval_mode=_request_mode(step, policy, approval_mode), risk=risk,
        risk_note=risk_note, sandbox_backend=str(spec.get("sandbox_backend", "")),
        network_policy=str(spec.get("network", network_policy)), preview=preview, run_spec=spec,
        arguments_sha256=spec_hash,
        expires_at=timezone.now() + timedelta(seconds=ttl) if ttl else None,
        **_policy_fields(policy, ttl),
    )
    if kind == ApprovalRequest.Kind.TOOL:
        step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.AWAITING_APPROVAL)
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="approval.requested",
                 payload={**_public(approval), "arguments": approval.arguments, "risk_note": risk_note,
                          "network_policy": network_policy, "sandbox_backend": sandbox_backend,
                          "expires_at": approval.expires_at.isoformat() if approval.expires_at else None})
    approval_changed.send(sender=ApprovalRequest, approval=approval, what="requested")
    return approval


def _policy_fields(policy: ResolvedPolicy | None, ttl: int) -> dict[str, Any]:
    if policy is None:
        return {}
    escalate_at = None
    if ttl and policy.escalate_before_seconds:
        escalate_at = timezone.now() + timedelta(seconds=max(ttl - policy.escalate_before_seconds, 0))
    return {"policy_id": policy.policy_id, "policy_reason": policy.reason,
            "required_approvals": policy.required_approvals, "reviewer_group_id": policy.reviewer_group_id,
            "escalation_group_id": policy.escalation_group_id, "escalate_at": escalate_at,
            "omit_arguments": policy.omit_arguments}


def _validate_edited(tool_name: str, arguments: Any) -> None:
    if not isinstance(arguments, dict):
        raise InvalidArguments("Edited arguments must be a JSON object", details={"field": "arguments"})
    tool = ToolDefinition.objects.filter(name=tool_name).first()
    if tool is None:
        return
    errors = validate_arguments(tool_name, tool.parameters_schema, arguments)
    if errors:
        raise InvalidArguments("Edited arguments do not match the tool's schema", details={"errors": errors})


def four_eyes_refusal(approval: ApprovalRequest, actor: User) -> PermissionDenied | None:
    """Why ``actor`` may not decide ``approval``, or None. The one check every path goes
    through (API, page, htmx; the queue's WebSocket only forwards events, it takes no decisions).

    Four-eyes (AGENTOPS_FORBID_SELF_APPROVAL, on by default; off for single-user installs): the
    one who wrote the input of the turn that produced the call, and the session's owner, may not
    decide it: with both roles (every admin) they could otherwise approve what their own input made.
    """
    if not actor.is_active or not actor.has_perm(DECIDE_APPROVALS):
        return PermissionDenied("You need the permission to decide approval requests.")
    if not has_team_role(actor, approval.team_id, REVIEW_ROLES):
        return PermissionDenied("Your role in this team does not allow you to decide its requests.",
                                code="team_role_required")
    if settings.AGENTOPS_FORBID_SELF_APPROVAL:
        if approval.turn.created_by_id == actor.pk:
            return PermissionDenied("You wrote the input that produced this call; another reviewer must decide it.",
                                    code="self_approval_forbidden", details={"reason": "turn_author"})
        if approval.session.owner_id == actor.pk:
            return PermissionDenied("You started this session; another reviewer must decide its requests.",
                                    code="self_approval_forbidden", details={"reason": "session_owner"})
    if (approval.reviewer_group_id is not None and not actor.is_superuser
            and not actor.groups.filter(pk=approval.reviewer_group_id).exists()):
        return PermissionDenied("This request's policy lets only its reviewer group decide it.",
                                code="not_eligible", details={"reviewer_group_id": approval.reviewer_group_id})
    return None


def _check_actor(approval: ApprovalRequest, actor: User) -> None:
    """Refuse an actor who may not decide, and audit the refusal. Called outside the decision's
    transaction (which a refusal rolls back); ``_decide`` checks again under the lock."""
    refusal = four_eyes_refusal(approval, actor)
    if refusal is not None:
        audit_record(approval, action=ApprovalAudit.Action.REFUSED, actor=actor,
                     details={"code": refusal.code, "message": refusal.message})
        raise refusal


def audit_record(approval: ApprovalRequest, *, action: str, actor: User | None,
                 details: dict[str, Any] | None = None) -> ApprovalAudit:
    """Append to a request's audit trail (rows without foreign keys to it: they outlive it)."""
    return ApprovalAudit.objects.create(request_id=approval.request_id, session_id=approval.session_id,
                                        team_id=approval.team_id, action=action, actor=actor,
                                        actor_username=actor.get_username() if actor else "",
                                        details=details or {})


def approval_viewed_record(*, approval: ApprovalRequest, actor: User) -> None:
    """Note in the audit trail that ``actor`` opened the request's page (once a minute at most:
    a reload is not news)."""
    recent = ApprovalAudit.objects.filter(request_id=approval.request_id, actor=actor,
                                          action=ApprovalAudit.Action.VIEWED,
                                          created_at__gte=timezone.now() - timedelta(minutes=1))
    if not recent.exists():
        audit_record(approval, action=ApprovalAudit.Action.VIEWED, actor=actor)


def approval_decide(*, request_id: uuid.UUID | str, actor: User, decision: str, reason: str = "",
                    seen_hash: str | None = None, arguments: dict[str, Any] | None = None,
                    remember: bool = False, require_seen_hash: bool = False,
                    grant_pattern: dict[str, str] | None = None) -> ApprovalRequest:
    """Record a reviewer's decision. Idempotent for the same decision; 409 otherwise. A request
    of a team the actor is not in is NotFound. Returns the request as the decision left it.

    Wakes the engine after commit. A request past its deadline that the sweeper has not reached
    yet is expired first, in its own transaction, so the refusal (409 ``expired``) does not roll
    the expiry back.
    """
    try:
        key = uuid.UUID(str(request_id))
    except ValueError as exc:
        raise NotFound(f"No approval request {request_id}") from exc
    # Another team's request is missing for the actor (as its scoped selectors say), not forbidden.
    approval = scope(ApprovalRequest.objects.select_related("session", "turn"), actor).filter(request_id=key).first()
    if approval is None:
        raise NotFound(f"No approval request {request_id}")
    _check_actor(approval, actor)
    if require_seen_hash and not seen_hash:
        raise InvalidArguments("Send the arguments_sha256 of the request you decide (what you reviewed).",
                               code="arguments_sha256_required", details={"field": "arguments_sha256"})
    if approval.status == Status.PENDING and approval.expires_at is not None and approval.expires_at <= timezone.now():
        _expire_one(approval.pk)
    return _decide(request_id=key, actor=actor, decision=decision, reason=reason, seen_hash=seen_hash,
                   arguments=arguments, remember=remember, grant_pattern=grant_pattern)


@transaction.atomic
def _decide(*, request_id: uuid.UUID, actor: User, decision: str, reason: str, seen_hash: str | None,
            arguments: dict[str, Any] | None, remember: bool,
            grant_pattern: dict[str, str] | None = None) -> ApprovalRequest:
    try:
        approval = locked_with_session(ApprovalRequest.objects.select_related("session", "turn"),
                                       request_id=request_id)
    except (ApprovalRequest.DoesNotExist, ValidationError) as exc:
        raise NotFound(f"No approval request {request_id}") from exc
    refusal = four_eyes_refusal(approval, actor)
    if refusal is not None:
        raise refusal
    allowed = TOOL_DECISIONS if approval.kind == ApprovalRequest.Kind.TOOL else RECOVERY_DECISIONS
    if decision not in allowed:
        raise InvalidArguments(f"A {approval.kind} request takes one of {sorted(str(d) for d in allowed)}",
                               details={"field": "decision", "allowed": sorted(str(d) for d in allowed)})
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
    if grant_pattern is not None:
        if not remember:
            raise InvalidArguments("A grant pattern needs remember", details={"field": "grant_pattern"})
        validate_pattern(grant_pattern, approval.arguments if arguments is None else arguments)

    vote = "decide" if approval.kind != ApprovalRequest.Kind.TOOL else quorum_vote(
        approval, actor=actor, decision=decision, reason=reason, seen_hash=seen_hash,
        edited=arguments is not None or remember)
    if vote != "decide":  # an approval short of the quorum (or its replay): the request stays pending
        if vote == "pending":
            approval_changed.send(sender=ApprovalRequest, approval=approval, what="voted")
        return approval
    approved_sha256 = approval.arguments_sha256
    if arguments is not None and approval.run_spec:
        approved_sha256 = spec_sha256(with_arguments(approval.run_spec, arguments))
    _move(approval, STATUS_OF_DECISION[Decision(decision)], decision=decision, decided_by=actor,
          decided_at=timezone.now(), reason=reason, seen_sha256=seen_hash or "", edited_arguments=arguments,
          edited_by=actor if arguments is not None else None, remember=remember, approved_sha256=approved_sha256)
    if arguments is not None:
        audit_record(approval, action=ApprovalAudit.Action.EDITED, actor=actor,
                     details={"original": approval.arguments, "edited": arguments})
    audit_record(approval, action=ApprovalAudit.Action.DECIDED, actor=actor,
                 details={"decision": decision, "reason": reason, "seen_sha256": seen_hash or "",
                          "arguments_sha256": approval.arguments_sha256, "remember": remember})
    _apply_to_step(approval)
    grant = grant_create(approval, actor=actor, pattern=grant_pattern) if remember else None
    event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                 type="approval.decided",
                 payload={**_public(approval), "decision": decision, "reason": reason,
                          "decided_by": actor.get_username(), "edited_arguments": arguments,
                          "remember": remember, "grant": grant_public(grant) if grant else None})
    approval_changed.send(sender=ApprovalRequest, approval=approval, what="decided")
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
    approval_changed.send(sender=ApprovalRequest, approval=approval, what="expired")
    dispatch.tick_enqueue(approval.turn_id)
    return 1


class RunSpecChanged(Conflict):
    """What would run now is not what the reviewer approved (the tool, its limits or the arguments
    changed since): the approval no longer covers it."""

    code = "approval_stale"


@joins_transaction
def approval_consume(*, request_id: uuid.UUID | str, run_sha256: str) -> ApprovalRequest:
    """Mark an approved request as used, exactly once, for a run whose spec hashes to ``run_sha256``
    (computed by the executing task from what it is about to run).

    Raises Conflict when it is not approved (consumed already: the caller must not run the tool
    again), StaleArguments when the row no longer matches its own hash, and RunSpecChanged when the
    run is not what was approved (the caller rolls back and calls ``approval_invalidate``).
    """
    approval = locked_with_session(ApprovalRequest.objects.all(), request_id=request_id)
    if approval.status != Status.APPROVED:
        raise Conflict(f"Approval {request_id} is {approval.status}, not approved", code="not_approved")
    spec = approval.run_spec
    if spec and (spec_sha256(spec) != approval.arguments_sha256 or spec.get("arguments") != approval.arguments
                 or spec.get("network") != approval.network_policy
                 or spec.get("sandbox_backend") != approval.sandbox_backend):
        raise StaleArguments("The approved request was altered after the decision.")
    if run_sha256 != (approval.approved_sha256 or approval.arguments_sha256):
        raise RunSpecChanged(details={"approved_sha256": approval.approved_sha256 or approval.arguments_sha256,
                                      "run_sha256": run_sha256})
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
