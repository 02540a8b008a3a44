"""Reads of fanout_app. Callers have checked that the user may see the session or batch."""

import uuid
from typing import Any

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery

from agentops.teams import scope
from fanout_app.models import Batch, BatchMember, SubagentLink
from sessions_app.models import AgentSession, Turn


def subagent_lineage(session_id: Any) -> dict[str, Any] | None:
    """Where a child session sits: its root, parent, parent step, depth and agent path (None: not a child)."""
    link = SubagentLink.objects.filter(child_id=session_id).first()
    if link is None:
        return None
    return {"root_session_id": str(link.root_id), "parent_session_id": str(link.parent_id),
            "parent_step_id": str(link.parent_step_id), "depth": link.depth, "agent_path": link.agent_path}


def subagent_children(session_id: Any) -> list[dict[str, Any]]:
    """A session's children with their live status, in spawn order (two queries)."""
    links = list(SubagentLink.objects.filter(parent_id=session_id).select_related("child")
                 .order_by("created_at", "index"))
    latest: dict[uuid.UUID, Turn] = {}
    for turn in Turn.objects.filter(session_id__in=[link.child_id for link in links]).order_by("index"):
        latest[turn.session_id] = turn
    out = []
    for link in links:
        last = latest.get(link.child_id)
        out.append({"session_id": str(link.child_id), "title": link.child.title, "index": link.index,
                    "parent_step_id": str(link.parent_step_id), "agent_path": link.agent_path,
                    "depth": link.depth, "session_status": link.child.status,
                    "turn_status": last.status if last else None,
                    "answer": (last.output_text if last else "")[:2000]})
    return out


def subagent_descendants(root_id: Any, *, child_id: Any = None) -> list[dict[str, Any]]:
    """Every child session spawned under ``root_id`` (nested ones too, closed ones too), in spawn
    order, with its status and task; or only ``child_id`` among them (one query)."""
    qs = SubagentLink.objects.filter(root_id=root_id).select_related("child", "parent__agent")
    if child_id is not None:
        try:
            qs = qs.filter(child_id=uuid.UUID(str(child_id)))
        except ValueError:
            return []
    return [{"session_id": str(link.child_id), "parent_session_id": str(link.parent_id),
             "parent_agent_slug": link.parent.agent.slug, "title": link.child.title,
             "agent_path": link.agent_path, "depth": link.depth, "task": link.task,
             "session_status": link.child.status, "created_at": link.created_at,
             "updated_at": link.child.updated_at}
            for link in qs.order_by("created_at", "depth", "index")]


def children_by_step(session_id: Any) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for child in subagent_children(session_id):
        grouped.setdefault(child["parent_step_id"], []).append(child)
    return grouped


# --- batches -----------------------------------------------------------------------------

def batches_list(*, user: Any) -> QuerySet[Batch]:
    return scope(Batch.objects.select_related("agent", "owner"), user).order_by("-created_at")


def batch_get(batch_id: Any, *, user: Any) -> Batch:
    from agentops.domain import NotFound

    try:
        key = uuid.UUID(str(batch_id))
    except ValueError as exc:
        raise NotFound(f"No batch {batch_id}") from exc
    batch = scope(Batch.objects.select_related("agent", "owner"), user).filter(pk=key).first()
    if batch is None:
        raise NotFound(f"No batch {batch_id}")
    return batch


def batch_progress(batch: Batch) -> dict[str, Any]:
    """Counts by session status, approvals waiting, failures, cancelled (four queries)."""
    sessions = AgentSession.objects.filter(batch_member__batch=batch)
    counts = {row["status"]: row["n"] for row in sessions.values("status").annotate(n=Count("id"))}
    done = Turn.objects.filter(session__batch_member__batch=batch, status=Turn.Status.COMPLETED) \
        .values("session_id").distinct().count()
    # A cancelled session is idle, its latest turn cancelled: "0 of 20 done" and 20 "Idle" rows
    # said nothing of the 20 cancelled by the operator (a batches audit).
    latest = Turn.objects.filter(session_id=OuterRef("pk")).order_by("-index").values("status")[:1]
    cancelled = sessions.annotate(last=Subquery(latest)).filter(last=Turn.Status.CANCELLED).count()
    from approvals_app.models import ApprovalRequest

    waiting = ApprovalRequest.objects.filter(session__batch_member__batch=batch, status="pending").count()
    return {"size": batch.size, "by_status": counts, "completed_sessions": done, "approvals_waiting": waiting,
            "cancelled": cancelled,
            "failed": counts.get(AgentSession.Status.FAILED, 0),
            "working": sum(counts.get(s, 0) for s in (AgentSession.Status.IN_PROGRESS,
                                                      AgentSession.Status.AWAITING_APPROVAL,
                                                      AgentSession.Status.REQUIRES_ACTION))}


def batch_members(batch: Batch, *, limit: int = 500) -> list[BatchMember]:
    return list(BatchMember.objects.filter(batch=batch).select_related("session").order_by("row")[:limit])


def batch_session_filter(batch_id: str) -> Q:
    """The session list's filter by batch (``?batch=<id>``)."""
    return Q(batch_member__batch_id=batch_id)
