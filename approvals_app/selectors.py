import uuid
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from agentops.domain import NotFound
from approvals_app.models import ApprovalGrant, ApprovalRequest


def approval_get(request_id: Any) -> ApprovalRequest:
    try:
        qs = ApprovalRequest.objects.select_related("decided_by", "session")
        return qs.get(request_id=uuid.UUID(str(request_id)))
    except (ValueError, ApprovalRequest.DoesNotExist) as exc:
        raise NotFound(f"No approval request {request_id}") from exc


def approvals_list(*, status: str | None = None, session: str | None = None, tool: str | None = None,
                   agent: str | None = None, risk: str | None = None,
                   oldest_first: bool = False) -> "QuerySet[ApprovalRequest]":
    qs = ApprovalRequest.objects.select_related("decided_by", "session", "session__agent")
    if status:
        qs = qs.filter(status=status)
    if session:
        try:
            qs = qs.filter(session_id=uuid.UUID(session))
        except ValueError:
            return qs.none()
    if tool:
        qs = qs.filter(tool_name=tool)
    if agent:
        qs = qs.filter(session__agent__slug=agent)
    if risk:
        qs = qs.filter(risk=risk)
    return qs.order_by(*(["created_at", "id"] if oldest_first else ["-created_at", "-id"]))


def approval_approved_for_step(step_id: uuid.UUID) -> ApprovalRequest | None:
    """The approved, not yet consumed, tool request of a step (the one its claim consumes)."""
    return (ApprovalRequest.objects.filter(step_id=step_id, kind=ApprovalRequest.Kind.TOOL,
                                           status=ApprovalRequest.Status.APPROVED).order_by("-created_at").first())


def grant_is_live(*, session_id: uuid.UUID | str, tool_name: str) -> bool:
    """Does a grant, neither revoked nor expired, let ``tool_name`` run in this session unasked?"""
    now = timezone.now()
    return ApprovalGrant.objects.filter(session_id=uuid.UUID(str(session_id)), tool_name=tool_name,
                                        revoked_at__isnull=True).exclude(expires_at__lte=now).exists()
