"""Approvals by request ID: list, read, decide."""

from typing import Any

from django.http import HttpRequest
from ninja import Router

from agentops.domain import InvalidArguments, PermissionDenied
from approvals_app import selectors, services
from approvals_app.models import ApprovalRequest
from approvals_app.schemas import ApprovalDecideIn, ApprovalOut, ApprovalPageOut
from sessions_app.schemas import ErrorOut

router = Router(tags=["approvals"])
ERRORS: dict[int, type[ErrorOut]] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut,
                                     413: ErrorOut, 422: ErrorOut}
VIEW = "approvals_app.view_approvalrequest"


def approval_out(a: ApprovalRequest) -> dict[str, Any]:
    return {
        "request_id": a.request_id, "kind": a.kind, "session_id": a.session_id, "turn_id": a.turn_id,
        "step_id": a.step_id, "tool_name": a.tool_name, "arguments": a.arguments,
        "arguments_sha256": a.arguments_sha256, "approval_mode": a.approval_mode, "risk": a.risk,
        "risk_note": a.risk_note, "sandbox_backend": a.sandbox_backend, "network_policy": a.network_policy,
        "preview": a.preview, "status": a.status, "decision": a.decision,
        "decided_by": a.decided_by.get_username() if a.decided_by else None, "decided_at": a.decided_at,
        "reason": a.reason, "edited_arguments": a.edited_arguments, "remember": a.remember,
        "expires_at": a.expires_at, "created_at": a.created_at,
    }


@router.get("/approvals", response={200: ApprovalPageOut, **ERRORS})
def approvals_list_api(request: HttpRequest, status: str | None = None, session: str | None = None,
                       tool: str | None = None, cursor: str | None = None, limit: int = 50) -> dict[str, Any]:
    if not request.user.has_perm(VIEW):
        raise PermissionDenied(f"You need the permission {VIEW}.")
    if status and status not in ApprovalRequest.Status.values:
        raise InvalidArguments(f"Unknown status {status!r}", details={"allowed": ApprovalRequest.Status.values})
    limit = max(1, min(limit, 200))
    qs = selectors.approvals_list(status=status, session=session, tool=tool)
    if cursor:
        if not cursor.isdigit():
            raise InvalidArguments("Invalid cursor", details={"field": "cursor"})
        qs = qs.filter(id__lt=int(cursor))
    rows = list(qs[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return {"items": [approval_out(a) for a in rows], "next_cursor": str(rows[-1].id) if more and rows else None}


@router.get("/approvals/{request_id}", response={200: ApprovalOut, **ERRORS})
def approval_get_api(request: HttpRequest, request_id: str) -> dict[str, Any]:
    if not request.user.has_perm(VIEW):
        raise PermissionDenied(f"You need the permission {VIEW}.")
    return approval_out(selectors.approval_get(request_id))


@router.post("/approvals/{request_id}/decision", response={200: ApprovalOut, **ERRORS})
def approval_decide_api(request: HttpRequest, request_id: str, payload: ApprovalDecideIn) -> dict[str, Any]:
    approval = services.approval_decide(
        request_id=selectors.approval_get(request_id).request_id, actor=request.user,  # type: ignore[arg-type]
        decision=payload.decision, reason=payload.reason, seen_hash=payload.arguments_sha256,
        arguments=payload.arguments, remember=payload.remember)
    return approval_out(selectors.approval_get(approval.request_id))
