"""Reads for sessions, turns, steps, events and artifacts."""

import uuid
from typing import Any

from django.db.models import QuerySet

from agentops.domain import NotFound
from sessions_app.models import AgentProfile, AgentSession, Artifact, Event, Step, Turn


def _get(qs: QuerySet[Any], pk: Any, what: str) -> Any:
    try:
        return qs.get(pk=uuid.UUID(str(pk)))
    except (ValueError, qs.model.DoesNotExist) as exc:
        raise NotFound(f"No {what} {pk}") from exc


def session_get(session_id: Any) -> AgentSession:
    return _get(AgentSession.objects.select_related("agent", "owner"), session_id, "session")


def turn_get(turn_id: Any) -> Turn:
    return _get(Turn.objects.select_related("session"), turn_id, "turn")


def artifact_get(artifact_id: Any) -> Artifact:
    return _get(Artifact.objects.select_related("session"), artifact_id, "artifact")


def agent_get(slug: str) -> AgentProfile:
    try:
        return AgentProfile.objects.get(slug=slug)
    except AgentProfile.DoesNotExist as exc:
        raise NotFound(f"No agent {slug!r}", details={"field": "agent"}) from exc


def agents_enabled() -> QuerySet[AgentProfile]:
    return AgentProfile.objects.filter(enabled=True).prefetch_related("tools")


def sessions_list(*, status: str | None = None, agent: str | None = None, owner: str | None = None,
                  q: str | None = None) -> QuerySet[AgentSession]:
    """Newest first; ``q`` searches titles and turn inputs."""
    from django.db.models import Exists, OuterRef, Q

    qs = AgentSession.objects.select_related("agent", "owner").order_by("-created_at", "-id")
    if status:
        qs = qs.filter(status=status)
    if agent:
        qs = qs.filter(agent__slug=agent)
    if owner:
        qs = qs.filter(owner__username=owner)
    if q:
        # EXISTS instead of a join: no duplicates, no DISTINCT over the whole table.
        inputs = Turn.objects.filter(session=OuterRef("pk"), input__icontains=q)
        qs = qs.filter(Q(title__icontains=q) | Exists(inputs))
    return qs


def events_after(*, session_id: Any, after: int = 0, limit: int = 200, until: int | None = None) -> list[Event]:
    qs = Event.objects.filter(session_id=session_id, seq__gt=after)
    if until is not None:
        qs = qs.filter(seq__lte=until)
    return list(qs.order_by("seq")[:limit])


def turn_steps(turn_id: Any) -> list[Step]:
    return list(Step.objects.filter(turn_id=turn_id).order_by("index"))


def turn_id_of_step(step_id: Any) -> uuid.UUID | None:
    """The turn a step belongs to, or None for an unknown step."""
    try:
        key = uuid.UUID(str(step_id))
    except ValueError:
        return None
    return Step.objects.filter(pk=key).values_list("turn_id", flat=True).first()
