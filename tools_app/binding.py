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
    if tool.source_version:  # only tools from a source have one: built-ins keep their version
        doc["source_version"] = tool.source_version
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()[:16]


def _limits(tool_name: str, tool_timeout: int, network: str, arguments: Any) -> dict[str, Any]:
    """run_command's sandbox limits for this call: its own timeout capped by the tool's (what
    ``run_command`` applies). Other tools run no command: no limits."""
    if tool_name != "run_command":
        return {}
    requested = arguments.get("timeout_seconds") if isinstance(arguments, dict) else None
    if isinstance(requested, float) and requested.is_integer():
        requested = int(requested)  # JSON Schema's integer takes 5.0, and run_command applies int(5.0)
    timeout = tool_timeout
    if isinstance(requested, int) and not isinstance(requested, bool) and requested > 0:
        timeout = min(requested, tool_timeout)
    return policy_for(timeout_seconds=timeout, network=network).to_dict()


def run_spec(*, tool: ToolDefinition, arguments: Any, sandbox_backend: str | None = None) -> dict[str, Any]:
    """The spec of one call of ``tool`` with ``arguments`` as it would run now."""
    backend = sandbox_backend if sandbox_backend is not None else str(sandbox_status().get("backend", ""))
    spec = {"tool": tool.name, "tool_version": tool_version(tool), "enabled": tool.enabled, "arguments": arguments,
            "network": tool.network, "timeout_seconds": tool.timeout_seconds,
            "limits": _limits(tool.name, tool.timeout_seconds, tool.network, arguments), "sandbox_backend": backend}
    if tool.env:  # the command's environment as configured: {{secret:NAME}} references, never values
        spec["env"] = tool.env
    return spec


def with_arguments(spec: dict[str, Any], arguments: Any) -> dict[str, Any]:
    """The spec a reviewer approves when they edit the arguments: the same tool version, network,
    timeout and backend as the request showed, the edited arguments, and the limits they imply."""
    edited = {**spec, "arguments": arguments}
    if "limits" in spec:
        edited["limits"] = _limits(str(spec.get("tool", "")), int(spec.get("timeout_seconds") or 60),
                                   str(spec.get("network", "none")), arguments)
    return edited


def spec_sha256(spec: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(spec).encode()).hexdigest()


def tool_spec_sha256(spec: dict[str, Any]) -> str:
    """The hash of a spec without its arguments (and the limits they imply): what a remembered
    approval (a grant) binds, since the calls it lets run have other arguments. An admin edit of
    the tool, its network, timeout or environment, or another sandbox backend, changes it."""
    return spec_sha256({key: value for key, value in spec.items() if key not in ("arguments", "limits")})


def spec_differences(approved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The top-level keys that differ: what the event tells the reviewer changed."""
    return sorted(key for key in set(approved) | set(current) if approved.get(key) != current.get(key))
