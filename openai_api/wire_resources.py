"""How agentops's subagents, secrets vault and sandbox hosts look on the Agents API's wire.

The peripheral half of ``openai_api.wire`` (same rule: nothing here writes or decides):

- subagent ↔ a child session (``fanout_app.SubagentLink``): its id is the child session's id, its
  ``session_id`` the session asked about (the root of nested children), ``parent_agent_id`` the
  parent session's agent slug; ``closed`` once the child has no turn working (idle or failed).
- vault ↔ a team's secret namespace (id = the team's slug): agentops secrets belong to one team,
  so a team *is* the vault. credential ↔ a ``vault_app.Secret`` of that team, of the wire's
  ``environment_variable`` kind (``secret_name`` = the secret's name, used as ``{{secret:NAME}}``);
  its value is write-only and never leaves. ``metadata.allowed_tools`` (comma-separated names or
  globs) is the secret's allowed tools, ``metadata.description`` its description.
- environment ↔ a sandbox host visible to the caller (``hosts_app.SandboxHost``, id = its name),
  always ``self_hosted``: agentops's hosted hosts and customer runners are both the operator's own.
"""

from typing import Any

from django.utils import timezone

from agentops.models import Team
from hosts_app.models import SandboxHost
from openai_api.wire import ts
from sessions_app.models import AgentSession
from vault_app.models import Secret

ENVIRONMENT_STATUS = {SandboxHost.Status.ONLINE: "connected", SandboxHost.Status.OFFLINE: "disconnected",
                      SandboxHost.Status.REVOKED: "expired"}
CLOSED_SESSION = (AgentSession.Status.IDLE, AgentSession.Status.FAILED)


def subagent_out(child: dict[str, Any], *, session_id: str) -> dict[str, Any]:
    """``child``: a row of ``fanout_app.selectors.subagent_descendants``."""
    closed = child["session_status"] in CLOSED_SESSION
    task = child.get("task") or {}
    text = str(task.get("instructions") or task.get("input") or "")
    return {"id": child["session_id"], "object": "agent.session.subagent", "session_id": session_id,
            # A root's child answers to the root agent (its slug); a grandchild to its parent subagent.
            "parent_agent_id": child["parent_agent_slug"] if child["depth"] <= 1 else child["parent_session_id"],
            "name": child["title"] or child["agent_path"],
            "instructions": [{"type": "input_text", "text": text}] if text else None,
            "status": "closed" if closed else "active", "opened_at": ts(child["created_at"]),
            "closed_at": ts(child["updated_at"]) if closed else None,
            # agentops extensions: where the child sits in the tree.
            "agentops_parent_session_id": child["parent_session_id"], "agentops_depth": child["depth"],
            "agentops_agent_path": child["agent_path"]}


def vault_out(team: Team) -> dict[str, Any]:
    return {"id": team.slug, "object": "vault", "created_at": ts(team.created_at), "metadata": {},
            "name": team.name}


def credential_out(secret: Secret, vault_id: str) -> dict[str, Any]:
    metadata = {}
    if secret.allowed_tools:
        metadata["allowed_tools"] = ",".join(secret.allowed_tools)
    if secret.description:
        metadata["description"] = secret.description
    if secret.expires_at is not None:
        metadata["expired"] = "true" if secret.expires_at <= timezone.now() else "false"
    return {"id": str(secret.id), "object": "vault.credential", "vault_id": vault_id, "name": secret.name,
            "metadata": metadata, "created_at": ts(secret.created_at), "updated_at": ts(secret.updated_at),
            # Never the value: the wire's write-only secret_value is not part of the resource.
            "auth": {"type": "environment_variable", "secret_name": secret.name,
                     "networking": {"type": "unrestricted"}}}


def environment_out(host: SandboxHost) -> dict[str, Any]:
    return {"id": host.name, "object": "agent.environment", "type": "self_hosted",
            "status": ENVIRONMENT_STATUS.get(SandboxHost.Status(host.status), "failed"),
            "files": [], "plugins": [], "skills": [],
            # agentops extensions: the host pool and its owner.
            "agentops_kind": host.kind, "agentops_pool": host.pool, "agentops_labels": host.labels,
            "agentops_team": host.team.slug if host.team else None}
