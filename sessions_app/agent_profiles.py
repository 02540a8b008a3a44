"""Agent profiles made by the integrations (the ``/openai/v1`` wire's agents): create, update and
retire a profile with the tools of its function declarations, each in one transaction."""

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentops.domain import Conflict, InvalidArguments
from sessions_app.models import AgentProfile
from tools_app.models import ToolDefinition
from tools_app.services import tool_definition_client_ensure


def _function_tools(team_id: int, functions: Sequence[Mapping[str, Any]]) -> list[ToolDefinition]:
    """The tools of an integration's function declarations (``name``, ``description``,
    ``parameters``): agentops's built-in of that name, else a client tool (``tools_app``)."""
    for f in functions:
        _claimable(team_id, f["name"], f.get("description", ""), f["parameters"])
    return [tool_definition_client_ensure(name=f["name"], description=f.get("description", ""),
                                          parameters_schema=f["parameters"]) for f in functions]


def _claimable(team_id: int, name: str, description: str, parameters: Any) -> None:
    """Tool definitions are one namespace: a team's declaration may not change what another team's
    agents see. Another team's MCP tool is refused; a client tool that another team's agents use
    only as it is (a declaration with another description rewrote it for every agent: the text the
    model reads, another tenant's to write). Refused as the name being taken, not whose it is."""
    tool = ToolDefinition.objects.filter(name=name).first()
    if tool is None or tool.kind == ToolDefinition.Kind.BUILTIN:
        return
    if tool.kind == ToolDefinition.Kind.MCP:
        theirs = not ToolDefinition.objects.filter(pk=tool.pk, mcp_tool__server__team_id=team_id).exists()
    else:
        shared = tool.agents.exclude(team_id=team_id).exists()
        theirs = shared and (tool.description != description or tool.parameters_schema != parameters)
    if theirs:
        raise Conflict(f"The tool name {name!r} is taken; give this function another name.",
                       code="tool_name_taken", details={"tool": name})


@transaction.atomic
def agent_profile_create(*, team_id: int, name: str, model: str, instructions: str = "",
                         metadata: Mapping[str, str] | None = None,
                         functions: Sequence[Mapping[str, Any]] | None = None, base_url: str = "") -> AgentProfile:
    """A new enabled agent profile of the team with an opaque slug (``agent_<hex>``) and the tools
    of ``functions``, in one transaction (a refused tool leaves nothing behind)."""
    tools = _function_tools(team_id, functions or [])
    agent = AgentProfile.objects.create(team_id=team_id, name=name[:120] or "agent",
                                        slug=f"agent_{uuid.uuid4().hex[:24]}", model=model,
                                        instructions=instructions, metadata=dict(metadata or {}), base_url=base_url)
    if tools:
        agent.tools.set(tools)
    return agent


@transaction.atomic
def agent_profile_update(*, agent_id: int, functions: Sequence[Mapping[str, Any]] | None = None,
                         **fields: Any) -> AgentProfile:
    """Change an agent profile's name, model, instructions or metadata, and replace its tools with
    those of ``functions`` when given. Sessions started later use the new settings."""
    allowed = {"name", "model", "instructions", "metadata"}
    unknown = set(fields) - allowed
    if unknown:
        raise InvalidArguments(f"Unknown agent fields: {sorted(unknown)}")
    agent = AgentProfile.objects.select_for_update().get(pk=agent_id)
    tools = _function_tools(agent.team_id, functions) if functions is not None else None
    for name, value in fields.items():
        setattr(agent, name, value)
    agent.save(update_fields=[*fields, "updated_at"])
    if tools is not None:
        agent.tools.set(tools)
    return agent


@transaction.atomic
def agent_profile_retire(*, agent_id: int) -> None:
    """Delete an agent profile; one that sessions still name is disabled instead (their history
    keeps it), so no new session can start from it."""
    agent = AgentProfile.objects.select_for_update().get(pk=agent_id)
    if agent.sessions.exists():
        AgentProfile.objects.filter(pk=agent.pk).update(enabled=False, updated_at=timezone.now())
    else:
        agent.delete()
