"""What an approval binds: everything that decides what a tool call does when it runs.

The reviewer approves a *run spec* — the tool's name and version, the arguments, network, limits,
timeout and sandbox backend — and its SHA-256. The executing task builds the spec again from what
it is about to run and compares: an admin who edits or disables the tool, or changes its network
or limits, after the approval, invalidates it instead of changing what runs.
"""

import hashlib
from typing import Any

from agentops.domain import canonical_json
from tools_app.builtin.command import policy_for
from tools_app.models import ToolDefinition
from tools_app.sandbox import sandbox_status

# The fields of a definition that change what a call does (not its description or approval mode).
VERSIONED_FIELDS = ("name", "kind", "parameters_schema", "network", "timeout_seconds", "max_attempts", "idempotent",
                    "enabled")


def tool_version(tool: ToolDefinition) -> str:
    """A short hash of the definition's behaviour-changing fields: any admin edit changes it."""
    doc = {name: getattr(tool, name) for name in VERSIONED_FIELDS}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()[:16]


def effective_timeout(tool: ToolDefinition, arguments: dict[str, Any]) -> int:
    """run_command's timeout: the call's own, capped by the tool's (what ``run_command`` applies)."""
    requested = arguments.get("timeout_seconds") if tool.name == "run_command" else None
    if isinstance(requested, int) and not isinstance(requested, bool) and requested > 0:
        return min(requested, tool.timeout_seconds)
    return tool.timeout_seconds


def run_spec(*, tool: ToolDefinition, arguments: Any, sandbox_backend: str | None = None) -> dict[str, Any]:
    """The spec of one call of ``tool`` with ``arguments`` as it would run now."""
    backend = sandbox_backend if sandbox_backend is not None else str(sandbox_status().get("backend", ""))
    args = arguments if isinstance(arguments, dict) else {}
    limits = (policy_for(timeout_seconds=effective_timeout(tool, args), network=tool.network).to_dict()
              if tool.name == "run_command" else {})
    return {"tool": tool.name, "tool_version": tool_version(tool), "enabled": tool.enabled, "arguments": arguments,
            "network": tool.network, "timeout_seconds": tool.timeout_seconds, "limits": limits,
            "sandbox_backend": backend}


def spec_sha256(spec: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(spec).encode()).hexdigest()


def spec_differences(approved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The top-level keys that differ: what the event tells the reviewer changed."""
    return sorted(key for key in set(approved) | set(current) if approved.get(key) != current.get(key))
