"""Retention: workspaces of sessions at rest are removed after a TTL; idempotency records expire.

A session is at rest when no turn of it is active; its workspace goes once it has had no event for
``AGENTOPS_WORKSPACE_TTL_HOURS``. Its artifacts were copied out of the workspace when they were
published (``AGENTOPS_ARTIFACT_ROOT``, content-addressed) and stay downloadable. Under the session
lock the workspace is renamed aside (one rename, so a turn that starts right after gets a fresh,
empty workspace and never shares the old one) and the session forgets it, with a
``workspace.removed`` event; the files are deleted after commit, outside the transaction.
A new turn of such a session starts in a fresh workspace seeded with the agent's starter files.

``Idempotency-Key`` records older than ``AGENTOPS_IDEMPOTENCY_TTL_HOURS`` are deleted: a key
replayed later runs again (a turn submitted with the same key is still found by its turn's own
key). Celery beat runs ``retention_sweep`` every ``AGENTOPS_RETENTION_SWEEP_SECONDS``; the
management command ``retention_sweep`` runs it by hand.
"""

import logging
import uuid
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentops.models import IdempotencyRecord
from sessions_app.engine.hosting import hooks as hosting
from sessions_app.events import event_record
from sessions_app.locks import session_lock
from sessions_app.models import AgentSession, Turn
from tools_app.sandbox import workspace_purge, workspace_retire

log = logging.getLogger(__name__)

BATCH = 500


def sessions_with_stale_workspaces(*, now: datetime, limit: int = BATCH) -> list[uuid.UUID]:
    """Sessions at rest (no active turn) with a workspace and no event for the workspace TTL."""
    cutoff = now - timedelta(hours=settings.AGENTOPS_WORKSPACE_TTL_HOURS)
    active = Turn.objects.filter(status__in=Turn.ACTIVE).values("session_id")
    return list(AgentSession.objects.exclude(workspace="").exclude(pk__in=active)
                .filter(status__in=[AgentSession.Status.IDLE, AgentSession.Status.FAILED], last_event_at__lt=cutoff)
                .order_by("last_event_at").values_list("pk", flat=True)[:limit])


def session_workspace_remove(*, session_id: uuid.UUID | str, now: datetime | None = None) -> bool:
    """Remove one session's workspace if it is still at rest and stale. Returns True when removed."""
    now = now or timezone.now()
    cutoff = now - timedelta(hours=settings.AGENTOPS_WORKSPACE_TTL_HOURS)
    with transaction.atomic():
        session_lock(session_id)
        session = AgentSession.objects.select_for_update().filter(pk=session_id).first()
        if (session is None or not session.workspace or session.last_event_at is None
                or session.last_event_at >= cutoff
                or Turn.objects.filter(session=session, status__in=Turn.ACTIVE).exists()):
            return False  # a turn started, or something happened, since it was picked
        if not hosting.workspace_is_local(session):
            return False  # only its sandbox host may open it (hosts keep their workspaces until moved)
        path = session.workspace
        retired = workspace_retire(Path(path))
        AgentSession.objects.filter(pk=session.pk).update(workspace="")
        event_record(session_id=session.id, type="workspace.removed",
                     payload={"reason": "retention", "ttl_hours": settings.AGENTOPS_WORKSPACE_TTL_HOURS})
    if retired is not None:
        workspace_purge(retired)
    log.info("removed the workspace %s of session %s (retention)", path, session_id)
    return True


def idempotency_records_expire(*, now: datetime | None = None) -> int:
    """Delete the idempotency records older than their TTL. Returns how many."""
    if not settings.AGENTOPS_IDEMPOTENCY_TTL_HOURS:
        return 0
    cutoff = (now or timezone.now()) - timedelta(hours=settings.AGENTOPS_IDEMPOTENCY_TTL_HOURS)
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted


def retention_sweep(*, now: datetime | None = None, dry_run: bool = False) -> dict[str, int]:
    """One pass: stale workspaces removed, old idempotency records deleted (``dry_run``: counted)."""
    now = now or timezone.now()
    counts = {"workspaces_removed": 0, "idempotency_records_deleted": 0}
    if settings.AGENTOPS_WORKSPACE_TTL_HOURS:
        while candidates := sessions_with_stale_workspaces(now=now):
            if dry_run:
                counts["workspaces_removed"] += len(candidates)
                break
            removed = sum(session_workspace_remove(session_id=pk, now=now) for pk in candidates)
            counts["workspaces_removed"] += removed
            if removed < len(candidates):
                break  # the rest changed meanwhile: the next pass sees them again
    if dry_run:
        cutoff = now - timedelta(hours=settings.AGENTOPS_IDEMPOTENCY_TTL_HOURS)
        counts["idempotency_records_deleted"] = (IdempotencyRecord.objects.filter(created_at__lt=cutoff).count()
                                                 if settings.AGENTOPS_IDEMPOTENCY_TTL_HOURS else 0)
    else:
        counts["idempotency_records_deleted"] = idempotency_records_expire(now=now)
    return counts
