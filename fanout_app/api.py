"""Subagents and batches: the integration API (team-scoped through the sessions' and batches' selectors)."""

from typing import Any

from ninja import Router, Schema
from ninja.responses import Status

from agentops.api import ERRORS
from agentops.http import AuthedRequest
from agentops.permissions import OPERATE_SESSIONS, VIEW_SESSIONS, require_perm
from agentops.schemas import STRICT_FIELDS, Out
from fanout_app import batches, selectors
from sessions_app import selectors as session_selectors

router = Router(tags=["subagents and batches"])


class SubagentsOut(Out):
    session_id: str
    parent: dict[str, Any] | None
    children: list[dict[str, Any]]


class BatchCreateIn(Schema):
    model_config = STRICT_FIELDS
    agent: str
    title: str = ""
    rows: list[dict[str, Any]]


class BatchOut(Out):
    id: str
    title: str
    agent: str
    owner: str
    size: int
    created_at: Any
    progress: dict[str, Any]
    sessions: list[dict[str, Any]]


class BatchCancelledOut(Out):
    cancelled: int
    batch: BatchOut


@router.get("/sessions/{session_id}/subagents", response={200: SubagentsOut, **ERRORS})
def session_subagents_api(request: AuthedRequest, session_id: str) -> dict[str, Any]:
    """A session's lineage (parent, root, parent step, agent path) and its children with their status."""
    require_perm(request.user, VIEW_SESSIONS)
    session = session_selectors.session_get(session_id, user=request.user)
    lineage = selectors.subagent_lineage(session.id)
    parent = {**lineage, "session_id": lineage["parent_session_id"]} if lineage else None
    return {"session_id": str(session.id), "parent": parent, "children": selectors.subagent_children(session.id)}


def batch_out(batch: Any, *, with_sessions: bool = True) -> dict[str, Any]:
    members = selectors.batch_members(batch) if with_sessions else []
    return {"id": str(batch.id), "title": batch.title, "agent": batch.agent.slug, "owner": batch.owner.get_username(),
            "size": batch.size, "created_at": batch.created_at, "progress": selectors.batch_progress(batch),
            "sessions": [{"row": m.row, "session_id": str(m.session_id), "status": m.session.status,
                          "title": m.session.title} for m in members]}


@router.post("/sessions/batch", response={201: BatchOut, 200: BatchOut, **ERRORS})
def batch_create_api(request: AuthedRequest, payload: BatchCreateIn) -> Status[dict[str, Any]]:
    """Start one session per row ({input, title?, pinned?, budget?, metadata?}); all or none. With an
    Idempotency-Key a replay returns the same batch (200); other rows under the same key: 409."""
    require_perm(request.user, OPERATE_SESSIONS)
    agent = session_selectors.agent_get(payload.agent, user=request.user)
    batch, created = batches.batch_create(agent=agent, owner=request.user, rows=payload.rows, title=payload.title,
                                          idempotency_key=request.headers.get("Idempotency-Key", ""))
    return Status(201 if created else 200, batch_out(batch))


@router.get("/batches/{batch_id}", response={200: BatchOut, **ERRORS})
def batch_get_api(request: AuthedRequest, batch_id: str) -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    return batch_out(selectors.batch_get(batch_id, user=request.user))


@router.post("/batches/{batch_id}/cancel", response={200: BatchCancelledOut, **ERRORS})
def batch_cancel_api(request: AuthedRequest, batch_id: str) -> dict[str, Any]:
    """Cancel every session of the batch that is working (its active turn, approvals and open
    steps); idle sessions are left alone. ``cancelled``: how many turns this call cancelled."""
    require_perm(request.user, OPERATE_SESSIONS)
    batch = selectors.batch_get(batch_id, user=request.user)
    cancelled = batches.batch_cancel(batch=batch, actor=request.user)
    return {"cancelled": cancelled, "batch": batch_out(batch)}
