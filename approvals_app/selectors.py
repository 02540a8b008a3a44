import uuid
from typing import Any

from django.db.models import QuerySet

from agentops.domain import NotFound
from approvals_app.models import ApprovalRequest


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
