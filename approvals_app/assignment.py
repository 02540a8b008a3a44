"""Who is on a request: advisory claims that lapse, and escalation before expiry.

A claim tells the other reviewers "I am on it" (live, through an ``approval.claimed`` event on the
queue's WebSocket); it does not stop anyone else from deciding (a 2-of-2 quorum needs a second
reviewer on a claimed request). A claim lapses at ``claimed_until``; the review sweep announces
the lapse. Escalation: a pending request whose policy names a lead time is, that long before it
expires, escalated once: its priority rises, its escalation group is notified. Expiry stays
expiry (never reported as a rejection).
"""

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agentops.domain import Conflict, NotFound, PermissionDenied
from approvals_app.models import ApprovalAudit, ApprovalRequest
from approvals_app.services import audit_record, four_eyes_refusal
from approvals_app.signals import approval_changed
from sessions_app.events import event_record

Status = ApprovalRequest.Status


def _locked(request_id: uuid.UUID | str) -> ApprovalRequest:
    try:
        return (ApprovalRequest.objects.select_for_update(of=("self",)).select_related("session", "turn")
                .get(request_id=uuid.UUID(str(request_id))))
    except (ValueError, ValidationError, ApprovalRequest.DoesNotExist) as exc:
        raise NotFound(f"No approval request {request_id}") from exc


def _claim_payload(approval: ApprovalRequest, **extra: Any) -> dict[str, Any]:
    return {"request_id": str(approval.request_id), "team_id": approval.team_id, "tool": approval.tool_name,
            "status": approval.status,
            "claimed_by": approval.claimed_by.get_username() if approval.claimed_by else None,
            "claimed_until": approval.claimed_until.isoformat() if approval.claimed_until else None, **extra}


@transaction.atomic
def approval_claim(*, request_id: uuid.UUID | str, actor: User, now: datetime | None = None) -> ApprovalRequest:
    """Claim a pending request for AGENTOPS_CLAIM_SECONDS (renews the actor's own claim). 409
    ``claimed`` while another reviewer's claim is live; 403 for who may not decide it."""
    now = now or timezone.now()
    approval = _locked(request_id)
    refusal = four_eyes_refusal(approval, actor)
    if refusal is not None:
        raise refusal
    if approval.status != Status.PENDING:
        raise Conflict(f"This request is {approval.status}; only a pending request can be claimed.",
                       code="not_pending", details={"status": approval.status})
    holder_live = approval.claimed_until is not None and approval.claimed_until > now
    if approval.claimed_by_id not in (None, actor.pk) and holder_live:
        raise Conflict(f"{approval.claimed_by.get_username()} is on this request.", code="claimed",  # type: ignore[union-attr]
                       details={"claimed_by": approval.claimed_by.get_username(),  # type: ignore[union-attr]
                                "claimed_until": approval.claimed_until.isoformat()})  # type: ignore[union-attr]
    approval.claimed_by, approval.claimed_until = actor, now + timedelta(seconds=settings.AGENTOPS_CLAIM_SECONDS)
    approval.save(update_fields=["claimed_by", "claimed_until", "updated_at"])
    audit_record(approval, action=ApprovalAudit.Action.CLAIMED, actor=actor,
                 details={"claimed_until": approval.claimed_until.isoformat()})
    event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                 type="approval.claimed", payload=_claim_payload(approval))
    return approval


@transaction.atomic
def approval_release(*, request_id: uuid.UUID | str, actor: User) -> ApprovalRequest:
    """Give a claim back (only its holder; a no-op when the actor holds none)."""
    approval = _locked(request_id)
    if four_eyes_refusal(approval, actor) is not None and approval.claimed_by_id != actor.pk:
        raise PermissionDenied("You may not act on this request.")
    if approval.claimed_by_id != actor.pk:
        return approval
    _clear_claim(approval, actor=actor, why="released")
    return approval


def _clear_claim(approval: ApprovalRequest, *, actor: User | None, why: str) -> None:
    holder = approval.claimed_by.get_username() if approval.claimed_by else None
    approval.claimed_by, approval.claimed_until = None, None
    approval.save(update_fields=["claimed_by", "claimed_until", "updated_at"])
    audit_record(approval, action=ApprovalAudit.Action.RELEASED, actor=actor, details={"why": why, "holder": holder})
    event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                 type="approval.released", payload=_claim_payload(approval, why=why, previous_holder=holder))


def approval_claims_lapse(*, now: datetime | None = None) -> int:
    """Clear the claims whose time ran out (an ``approval.released`` event each, ``why: timeout``)."""
    now = now or timezone.now()
    due = ApprovalRequest.objects.filter(claimed_by__isnull=False, claimed_until__lte=now).values_list(
        "request_id", flat=True)
    count = 0
    for request_id in due:
        with transaction.atomic():
            approval = _locked(request_id)
            if approval.claimed_by_id is not None and approval.claimed_until and approval.claimed_until <= now:
                _clear_claim(approval, actor=None, why="timeout")
                count += 1
    return count


def approval_escalate_due(*, now: datetime | None = None) -> int:
    """Escalate, once, each pending request whose escalation time came (and that has not expired):
    priority up by one, an ``approval.escalated`` event, its escalation group notified."""
    now = now or timezone.now()
    due = ApprovalRequest.objects.filter(status=Status.PENDING, escalate_at__lte=now,
                                         escalated_at__isnull=True).values_list("request_id", flat=True)
    count = 0
    for request_id in due:
        with transaction.atomic():
            approval = _locked(request_id)
            if approval.status != Status.PENDING or approval.escalated_at is not None:
                continue
            if approval.expires_at is not None and approval.expires_at <= now:
                continue  # it is due to expire, not to escalate: the expiry sweep records that
            ApprovalRequest.objects.filter(pk=approval.pk).update(escalated_at=now, priority=F("priority") + 1)
            approval.refresh_from_db(fields=["escalated_at", "priority"])
            audit_record(approval, action=ApprovalAudit.Action.ESCALATED, actor=None,
                         details={"escalation_group_id": approval.escalation_group_id, "priority": approval.priority})
            event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                         type="approval.escalated",
                         payload={"request_id": str(approval.request_id), "team_id": approval.team_id,
                                  "tool": approval.tool_name, "status": approval.status,
                                  "priority": approval.priority,
                                  "expires_at": approval.expires_at.isoformat() if approval.expires_at else None})
            approval_changed.send(sender=ApprovalRequest, approval=approval, what="escalated")
            count += 1
    return count
