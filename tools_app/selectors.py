"""Reads for tools_app."""

import threading
import time
from typing import Any

from django.db.models import Q, QuerySet

from agentops.teams import is_active, teams_of

from .models import ToolDefinition


def tool_definition_get(name: str) -> ToolDefinition | None:
    """The ToolDefinition named ``name``, or None (the caller decides whether unknown is an error)."""
    return ToolDefinition.objects.filter(name=name).first()


def tool_definitions_enabled() -> QuerySet[ToolDefinition]:
    return ToolDefinition.objects.filter(enabled=True).order_by("name")


def tool_definitions_visible(*, user: Any) -> QuerySet[ToolDefinition]:
    """The enabled tools ``user`` may see: the built-in ones, their teams' MCP servers' tools (an
    MCP server, its tools with their descriptions and schemas, belongs to its team) and the client
    (function) tools declared by their teams' agents. Another team's function tool, declared
    through the OpenAI wire with its own description and schema, was listed to everyone."""
    teams = teams_of(user)
    if not is_active(user):
        return ToolDefinition.objects.none()
    qs = tool_definitions_enabled()
    if teams is None:
        return qs
    mine = ToolDefinition.objects.filter(
        Q(kind=ToolDefinition.Kind.CLIENT, agents__team_id__in=teams) | Q(mcp_tool__server__team_id__in=teams))
    return qs.filter(Q(pk__in=mine.values("pk"))
                     | (Q(mcp_tool__isnull=True) & ~Q(kind=ToolDefinition.Kind.CLIENT)))


# The engine consults the tool registry several times a step: it is cached, and an admin's change
# to a tool or to an agent's tools shows within this many seconds.
TOOL_CACHE_SECONDS = 2.0
_cache: dict[Any, tuple[float, Any]] = {}
_cache_lock = threading.Lock()


def _cached(key: Any, load: Any) -> Any:
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and time.monotonic() - hit[0] <= TOOL_CACHE_SECONDS:
            return hit[1]
    value = load()
    with _cache_lock:
        _cache[key] = (time.monotonic(), value)
    return value


def tool_definitions_by_name() -> dict[str, ToolDefinition]:
    """Every ToolDefinition by name (cached)."""
    rows: dict[str, ToolDefinition] = _cached(
        "by_name", lambda: {t.name: t for t in ToolDefinition.objects.all()})
    return rows


def tool_names_of_agent(agent_id: int) -> frozenset[str]:
    """The names of the tools an agent profile may use, enabled or not (cached)."""
    names: frozenset[str] = _cached(
        ("agent", agent_id),
        lambda: frozenset(ToolDefinition.objects.filter(agents=agent_id).values_list("name", flat=True)))
    return names


def tool_definitions_cache_clear() -> None:
    with _cache_lock:
        _cache.clear()
