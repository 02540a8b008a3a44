"""Reads for approval requests and grants: the API, the reviewers' queue and the pages that show
an approval next to its step."""

import uuid
from collections.abc import Iterable
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


def approval_get_for_page(request_id: Any) -> ApprovalRequest:
    """An approval with everything its decision page shows (one query); NotFound otherwise."""
    try:
        return (ApprovalRequest.objects.select_related("session__agent", "session__owner", "turn__created_by",
                                                       "step", "decided_by")
                .get(request_id=uuid.UUID(str(request_id))))
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


def approval_queue(*, order: str = "oldest", tool: str = "", agent: str = "", risk: str = "",
                   limit: int = 100) -> list[ApprovalRequest]:
    """The pending requests with their session, agent, owner and turn. One query."""
    qs = approvals_list(status=ApprovalRequest.Status.PENDING, tool=tool, agent=agent, risk=risk,
                        oldest_first=order != "newest")
    return list(qs.select_related("session__owner", "turn")[:limit])


def queue_tools() -> list[str]:
    """The tools that have pending requests (the queue filter's choices)."""
    return list(ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING).order_by("tool_name")
                .values_list("tool_name", flat=True).distinct())


def pending_summary() -> tuple[int, ApprovalRequest | None]:
    """How many requests wait for a reviewer, and the oldest of them. Two queries."""
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    return pending.count(), pending.select_related("session").order_by("created_at").first()


def approvals_by_request_id(request_ids: Iterable[Any]) -> dict[str, ApprovalRequest]:
    """Approvals as a queue item shows them, by request id as text. One query (none for no ids)."""
    ids = []
    for value in request_ids:
        try:
            ids.append(uuid.UUID(str(value)))
        except ValueError:
            continue
    if not ids:
        return {}
    rows = ApprovalRequest.objects.filter(request_id__in=ids).select_related("session__agent", "session__owner", "turn")
    return {str(a.request_id): a for a in rows}


def latest_approval_by_step(step_ids: Iterable[Any]) -> dict[Any, ApprovalRequest]:
    """Each step's latest approval request (with who decided), by step id. One query (none for no ids)."""
    ids = list(step_ids)
    if not ids:
        return {}
    latest: dict[Any, ApprovalRequest] = {}
    for approval in (ApprovalRequest.objects.filter(step_id__in=ids).select_related("decided_by")
                     .order_by("created_at", "id")):
        latest[approval.step_id] = approval
    return latest


def approval_approved_for_step(step_id: uuid.UUID) -> ApprovalRequest | None:
    """The approved, not yet consumed, tool request of a step (the one its claim consumes)."""
    return (ApprovalRequest.objects.filter(step_id=step_id, kind=ApprovalRequest.Kind.TOOL,
                                           status=ApprovalRequest.Status.APPROVED).order_by("-created_at").first())


def grant_is_live(*, session_id: uuid.UUID | str, tool_name: str) -> bool:
    """Does a grant, neither revoked nor expired, let ``tool_name`` run in this session unasked?"""
    now = timezone.now()
    return ApprovalGrant.objects.filter(session_id=uuid.UUID(str(session_id)), tool_name=tool_name,
                                        revoked_at__isnull=True).exclude(expires_at__lte=now).exists()


def approvals_pending_of_session(session_id: Any) -> list[ApprovalRequest]:
    """The session's requests waiting for a reviewer, oldest first."""
    return approvals_pending_of_sessions([session_id])


def approvals_pending_of_sessions(session_ids: Iterable[Any]) -> list[ApprovalRequest]:
    """Requests of these sessions waiting for a reviewer, oldest first; one query (none for no ids)."""
    keys = list(session_ids)
    if not keys:
        return []
    return list(ApprovalRequest.objects.filter(session_id__in=keys, status=ApprovalRequest.Status.PENDING)
                .order_by("created_at", "id"))
