"""Reads of sandbox hosts: team-scoped lists with their load, a session's host."""

from typing import Any

from django.db.models import Count, Q, QuerySet

from agentops.domain import NotFound
from agentops.teams import teams_of
from hosts_app.models import SandboxHost, SessionPlacement
from sessions_app.models import Step, Turn


def hosts_visible(user: Any) -> QuerySet[SandboxHost]:
    """Hosted hosts (the operator's shared machines) and the runners of the user's teams, each
    with its load: ``active_sessions`` (pinned sessions with a turn working) and ``running_steps``,
    of the user's teams (a shared host's load counted every team's sessions: another team's activity,
    shown to anyone with a role)."""
    qs = SandboxHost.objects.all()
    if not (user is not None and getattr(user, "is_authenticated", False) and user.is_active):
        return qs.none()
    teams = teams_of(user)
    mine = Q()
    if teams is not None:
        qs = qs.filter(Q(kind=SandboxHost.Kind.HOSTED) | Q(team_id__in=teams))
        mine = Q(placements__session__team_id__in=teams)
    return qs.select_related("team").annotate(
        active_sessions=Count("placements", filter=Q(placements__session__turns__status__in=Turn.ACTIVE) & mine,
                              distinct=True),
        running_steps=Count("placements__session__steps",
                            filter=Q(placements__session__steps__status=Step.Status.RUNNING,
                                     placements__session__steps__kind=Step.Kind.TOOL) & mine, distinct=True))


def host_visible_get(*, user: Any, name: str) -> SandboxHost:
    host = hosts_visible(user).filter(name=name).first()
    if host is None:
        raise NotFound(f"No sandbox host {name!r}")
    return host


def session_host(session_id: Any) -> SandboxHost | None:
    """The host a session is pinned to (None: not pinned, the one-machine default)."""
    placement = SessionPlacement.objects.select_related("host").filter(session_id=session_id).first()
    return placement.host if placement else None


def host_load(host: SandboxHost) -> int:
    """Sessions pinned to the host with a turn working now."""
    return (SessionPlacement.objects.filter(host=host, session__turns__status__in=Turn.ACTIVE)
            .values("session_id").distinct().count())
