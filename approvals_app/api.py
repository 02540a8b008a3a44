"""Approvals by request ID: list, read, decide."""

from typing import Any

from django.conf import settings
from ninja import Router

from agentops.api import ERRORS
from agentops.domain import InvalidArguments
from agentops.http import AuthedRequest
from agentops.pagination import get_paginated_response
from agentops.permissions import VIEW_APPROVALS, require_perm
from approvals_app import grants, selectors, services
from approvals_app.models import ApprovalGrant, ApprovalRequest
from approvals_app.schemas import ApprovalDecideIn, ApprovalOut, ApprovalPageOut, GrantOut
from fanout_app.selectors import subagent_lineage
from sessions_app import selectors as session_selectors

router = Router(tags=["approvals"])


# Fields of ApprovalRequest that approval_out does not read (reading one of them on a deferred row
# would cost a query per row: the list test counts them).
NOT_IN_APPROVAL_OUT = ("team", "run_spec", "approved_sha256", "seen_sha256", "consumed_at", "policy",
                       "reviewer_group", "escalation_group", "escalate_at", "escalated_at", "omit_arguments",
                       "updated_at")


def approval_out(a: ApprovalRequest) -> dict[str, Any]:
    return {
        "request_id": a.request_id, "kind": a.kind, "session_id": a.session_id, "turn_id": a.turn_id,
        "step_id": a.step_id, "tool_name": a.tool_name, "arguments": a.arguments,
        "arguments_sha256": a.arguments_sha256, "approval_mode": a.approval_mode, "risk": a.risk,
        "risk_note": a.risk_note, "sandbox_backend": a.sandbox_backend, "network_policy": a.network_policy,
        "preview": a.preview, "status": a.status, "decision": a.decision,
        "decided_by": a.decided_by.get_username() if a.decided_by else None, "decided_at": a.decided_at,
        "reason": a.reason, "edited_arguments": a.edited_arguments,
        "edited_by": a.edited_by.get_username() if a.edited_by else None, "remember": a.remember,
        "expires_at": a.expires_at, "created_at": a.created_at, "policy": a.policy_reason,
        "required_approvals": a.required_approvals, "priority": a.priority,
        "claimed_by": a.claimed_by.get_username() if a.claim_live and a.claimed_by else None,
        "claimed_until": a.claimed_until if a.claim_live else None,
    }


@router.get("/approvals", response={200: ApprovalPageOut, **ERRORS})
def approvals_list_api(request: AuthedRequest, status: str | None = None, session: str | None = None,
                       tool: str | None = None, cursor: str | None = None, limit: int = 50) -> dict[str, Any]:
    require_perm(request.user, VIEW_APPROVALS)
    if status and status not in ApprovalRequest.Status.values:
        raise InvalidArguments(f"Unknown status {status!r}", details={"allowed": ApprovalRequest.Status.values})
    # The page shows the deciders' names, nothing of the session or its agent (the queue page does),
    # and none of the fields below: left unread, they cost neither the transfer nor a model field
    # each (a reviewer bot polls this list; the JSON of run_spec alone is ~500 bytes a row).
    qs = selectors.approvals_list(user=request.user, status=status, session=session, tool=tool).select_related(
        None).select_related("decided_by", "edited_by", "claimed_by").defer(*NOT_IN_APPROVAL_OUT)
    return get_paginated_response(queryset=qs,
                                  cursor=cursor, limit=limit, serialize=approval_out)


@router.get("/approvals/{request_id}", response={200: ApprovalOut, **ERRORS})
def approval_get_api(request: AuthedRequest, request_id: str) -> dict[str, Any]:
    require_perm(request.user, VIEW_APPROVALS)
    approval = selectors.approval_get(request_id, user=request.user)
    # The run spec the hash is taken over (the secrets and environment a call uses, by reference):
    # a reviewer deciding through the API sees what the decision page shows, and can recompute it.
    return {**approval_out(approval), "lineage": subagent_lineage(approval.session_id),
            "run_spec": approval.run_spec or None}


@router.post("/approvals/{request_id}/decision", response={200: ApprovalOut, **ERRORS})
def approval_decide_api(request: AuthedRequest, request_id: str, payload: ApprovalDecideIn) -> dict[str, Any]:
    # approval_decide finds the request among the reviewer's teams (404 otherwise), checks the
    # permission and four-eyes, and returns the request as it left it (no read again for the answer).
    approval = services.approval_decide(
        request_id=request_id, actor=request.user,
        decision=payload.decision, reason=payload.reason, seen_hash=payload.arguments_sha256,
        arguments=payload.arguments, remember=payload.remember,
        require_seen_hash=settings.AGENTOPS_API_REQUIRE_ARGUMENTS_SHA256, grant_pattern=payload.grant_pattern)
    return approval_out(approval)


def grant_out(g: ApprovalGrant, current_turn_id: Any = None) -> dict[str, Any]:
    return {
        "grant_id": g.pk, "session_id": g.session_id, "tool_name": g.tool_name,
        "arguments_sha256": g.arguments_sha256 or None, "argument_pattern": g.argument_pattern,
        "turn_id": g.turn_id, "expires_at": g.expires_at, "uses": g.uses, "last_used_at": g.last_used_at,
        "live": selectors.grant_is_live_now(g, current_turn_id=current_turn_id),
        "granted_by": g.granted_by.get_username() if g.granted_by else None, "revoked_at": g.revoked_at,
        "revoked_by": g.revoked_by.get_username() if g.revoked_by else None,
        "source_request_id": g.source_request.request_id if g.source_request else None, "created_at": g.created_at,
    }


@router.get("/sessions/{session_id}/grants", response={200: list[GrantOut], **ERRORS})
def grants_list_api(request: AuthedRequest, session_id: str) -> list[dict[str, Any]]:
    """The session's remembered approvals with their uses; ``live`` is false once revoked, expired
    or ended with their turn."""
    require_perm(request.user, VIEW_APPROVALS)
    session = session_selectors.session_get(session_id, user=request.user)
    current = session_selectors.current_turn_id(session.id)
    return [grant_out(g, current) for g in selectors.grants_of_session(session.id, user=request.user)]


@router.post("/grants/{grant_id}/revoke", response={200: GrantOut, **ERRORS})
def grant_revoke_api(request: AuthedRequest, grant_id: str) -> dict[str, Any]:
    grant = selectors.grant_get(grant_id, user=request.user)
    grants.grant_revoke(grant_id=grant.pk, actor=request.user)
    (fresh,) = [g for g in selectors.grants_of_session(grant.session_id, user=request.user) if g.pk == grant.pk]
    return grant_out(fresh)
