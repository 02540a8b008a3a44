"""Starting a session in the wire's environment: the one write the wire adds to agentops's services.

- ``{"type": "none"}``: a session without a sandbox. Its agent may hold only tools that need no
  workspace (client tools the SDK runs, MCP tools); one with a built-in (``write_file``,
  ``run_command``…) or ``spawn_subagents`` is refused at creation (400, ``param:
  environment.type``), never accepted and then quietly given a workspace. The tools it may use are
  fixed at creation (``metadata.agentops_tools``, the engine's own narrowing: what the model is
  offered and what the gate lets through), so a workspace tool added to the agent later is not
  offered to it either.
- ``{"type": "self_hosted"}``: agentops's sandbox hosts. With ``environment_id`` (a host of
  ``environments.list``: a hosted host, or a runner of the session's team) or ``agentops_pool``
  the session is pinned there in the transaction that creates it, before its first tick can pin
  it elsewhere; with neither it goes where any agentops session of its agent goes (its host pool).

The environment is recorded in ``metadata.agentops_environment``, so agentops's own API shows it.
"""

from typing import Any

from django.contrib.auth.models import User

from agentops.domain import InvalidArguments, joins_transaction
from hosts_app.services import session_pin_chosen
from openai_api.parse import RESERVED_METADATA, EnvironmentSpec, WireError
from sessions_app.engine import commands as engine
from sessions_app.locks import session_lock
from sessions_app.models import AgentProfile, AgentSession, Turn
from sessions_app.services import session_metadata_update
from tools_app.models import ToolDefinition
from tools_app.selectors import tool_definitions_by_name, tool_names_of_agent

NO_WORKSPACE_KINDS = (ToolDefinition.Kind.CLIENT, ToolDefinition.Kind.MCP)


def workspace_tools(agent: AgentProfile) -> list[str]:
    """The agent's tools that open a workspace (built-ins, subagents): none of them in a ``none`` session."""
    definitions = tool_definitions_by_name()
    return sorted(name for name in tool_names_of_agent(agent.pk)
                  if (d := definitions.get(name)) is None or d.kind not in NO_WORKSPACE_KINDS)


@joins_transaction  # pinned before the first tick, which runs after commit
def session_start_in(*, environment: EnvironmentSpec, agent: AgentProfile, owner: User, input: str,
                     metadata: dict[str, str] | None, idempotency_key: str = "") -> tuple[AgentSession, Turn | None]:
    meta: dict[str, Any] = dict(metadata or {})
    if environment.type == "none":
        needing = workspace_tools(agent)
        if needing:
            raise WireError(f"Agent {agent.slug} has tools that need a workspace ({', '.join(needing)}), and an "
                            "environment of type none has no sandbox: start the session with environment "
                            "{\"type\": \"self_hosted\"}, or use an agent without them.",
                            code="unsupported_parameter", param="environment.type")
        meta["agentops_environment"] = {"type": "none"}
        meta["agentops_tools"] = sorted(tool_names_of_agent(agent.pk))
        return engine.session_start(agent=agent, owner=owner, input=input, metadata=meta,
                                    idempotency_key=idempotency_key)
    meta["agentops_environment"] = {"type": "self_hosted", "environment_id": environment.environment_id,
                                    "pool": environment.pool}
    session, turn = engine.session_start(agent=agent, owner=owner, input=input, metadata=meta,
                                         idempotency_key=idempotency_key)
    if environment.environment_id is not None or environment.pool is not None:
        try:
            session_pin_chosen(session=session, host_name=environment.environment_id, pool=environment.pool)
        except InvalidArguments as exc:  # rolls the session back: nothing is created
            raise WireError(exc.message, param="environment.environment_id" if environment.environment_id
                            is not None else "environment.agentops_pool") from exc
    return session, turn


@joins_transaction
def session_metadata_set(*, session_id: str, metadata: dict[str, Any]) -> None:
    """The wire replaces the integration's metadata; agentops's own keys (the environment, the tool
    subset) stay as they were."""
    session_lock(session_id)
    current = AgentSession.objects.values_list("metadata", flat=True).get(pk=session_id) or {}
    kept = {k: v for k, v in current.items() if k in RESERVED_METADATA}
    session_metadata_update(session_id=session_id, metadata={**metadata, **kept})
