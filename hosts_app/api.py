"""Sandbox hosts in the integration API: the list with status and load, a session's host, and
moving a session to another host. The runners' own endpoints are in ``hosts_app.runner_api``."""

from typing import Any

from ninja import Router
from ninja.responses import Status

from agentops.api import ERRORS
from agentops.domain import NotFound
from agentops.http import AuthedRequest
from agentops.models import Team
from agentops.permissions import VIEW_SESSIONS, require_perm
from agentops.teams import scope
from hosts_app import runners, selectors, services
from hosts_app.models import SandboxHost
from hosts_app.schemas import HostOut, RunnerCreatedOut, RunnerCreateIn, SessionHostOut, SessionMoveIn
from sessions_app import selectors as session_selectors

router = Router(tags=["hosts"])


def host_out(h: SandboxHost) -> dict[str, Any]:
    return {"name": h.name, "kind": h.kind, "pool": h.pool, "labels": h.labels, "capacity": h.capacity,
            "status": h.status, "last_heartbeat_at": h.last_heartbeat_at, "versions": h.versions,
            "self_test": h.self_test, "team": h.team.slug if h.team else None,
            "active_sessions": getattr(h, "active_sessions", 0), "running_steps": getattr(h, "running_steps", 0)}


@router.get("/hosts", response={200: list[HostOut], **ERRORS})
def host_list_api(request: AuthedRequest) -> list[dict[str, Any]]:
    require_perm(request.user, VIEW_SESSIONS)  # their load counts sessions: not for a user with no role
    return [host_out(h) for h in selectors.hosts_visible(request.user)]


@router.get("/hosts/{name}", response={200: HostOut, **ERRORS})
def host_get_api(request: AuthedRequest, name: str) -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    return host_out(selectors.host_visible_get(user=request.user, name=name))


def _session_host(session_id: str) -> dict[str, Any]:
    host = selectors.session_host(session_id)
    return {"session_id": str(session_id), "host": host.name if host else None,
            "kind": host.kind if host else None, "status": host.status if host else None}


@router.get("/sessions/{session_id}/host", response={200: SessionHostOut, **ERRORS})
def session_host_api(request: AuthedRequest, session_id: str) -> dict[str, Any]:
    session = session_selectors.session_get(session_id, user=request.user)
    return _session_host(str(session.id))


@router.post("/sessions/{session_id}/host", response={200: SessionHostOut, **ERRORS})
def session_move_api(request: AuthedRequest, session_id: str, payload: SessionMoveIn) -> dict[str, Any]:
    session = session_selectors.session_to_operate(session_id, user=request.user)
    services.session_move(session_id=session.id, host_name=payload.host, actor=request.user)
    return _session_host(str(session.id))


@router.post("/runners", response={201: RunnerCreatedOut, **ERRORS})
def runner_create_api(request: AuthedRequest, payload: RunnerCreateIn) -> Status:
    """A customer runner of one of your teams; its token is in this response only."""
    team = scope(Team.objects.all(), request.user, field="id").filter(slug=payload.team).first()
    if team is None:
        raise NotFound(f"No team {payload.team!r}")
    host, token = runners.runner_create(team=team, name=payload.name, actor=request.user, pool=payload.pool,
                                        labels=payload.labels, capacity=payload.capacity)
    return Status(201, {"name": host.name, "team": team.slug, "token": token})


@router.post("/runners/{name}/token", response={200: RunnerCreatedOut, **ERRORS})
def runner_token_rotate_api(request: AuthedRequest, name: str) -> dict[str, Any]:
    """A new token for a runner (and a new job-signing key pair); the old token stops working at
    once. Its only copy is in this response."""
    host = selectors.host_visible_get(user=request.user, name=name)
    host, token = runners.runner_token_rotate(name=host.name, actor=request.user)
    return {"name": host.name, "team": host.team.slug if host.team else "", "token": token}


@router.post("/runners/{name}/revoke", response={200: HostOut, **ERRORS})
def runner_revoke_api(request: AuthedRequest, name: str) -> dict[str, Any]:
    host = selectors.host_visible_get(user=request.user, name=name)
    runners.runner_revoke(name=host.name, actor=request.user)
    return host_out(selectors.host_visible_get(user=request.user, name=name))
