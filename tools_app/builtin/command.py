"""run_command: one shell command in the session's sandbox, with effect evidence around it."""

import math
from typing import Any

from django.conf import settings

from tools_app.sandbox import SandboxPolicy, manifest_diff, run_sandboxed, workspace_manifest
from tools_app.sandbox.argv import env_file_data

from .files import published_from_changes
from .registry import ToolContext, ToolError, ToolResult, cap_text

COMMAND_MAX_CHARS = 64 * 1024  # execve refuses a single argument over 128 KiB anyway

RUN_COMMAND_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "minLength": 1, "maxLength": COMMAND_MAX_CHARS,
                    "description": "Shell command, run with /bin/sh -c in /workspace."},
        "cwd": {"type": "string", "maxLength": 4096, "default": ".",
                "description": "Working directory relative to /workspace."},
        "timeout_seconds": {"type": "integer", "minimum": 1,
                            "description": "Wall-clock limit; capped at the tool's configured timeout."},
    },
    "required": ["command"],
    "additionalProperties": False,
}


def policy_for(*, timeout_seconds: int, network: str) -> SandboxPolicy:
    """The sandbox policy run_command uses; the engine hashes it into the approval."""
    return SandboxPolicy(network="host" if network == "host" else "none", timeout_seconds=timeout_seconds,
                         cpu_seconds=max(1, math.ceil(timeout_seconds)))


def _combined_output(stdout: str, stderr: str) -> str:
    if not stderr:
        return stdout
    return f"{stdout}{'' if not stdout or stdout.endswith(chr(10)) else chr(10)}[stderr]\n{stderr}"


def run_command(ctx: ToolContext, manifest_before: dict[str, Any] | None = None) -> ToolResult:
    requested = ctx.arguments.get("timeout_seconds")
    timeout = min(int(requested), ctx.timeout_seconds) if requested else ctx.timeout_seconds
    policy = policy_for(timeout_seconds=timeout, network=ctx.network)
    before = manifest_before if manifest_before is not None else workspace_manifest(ctx.workspace)
    if ctx.env:
        try:
            env_file_data(ctx.env)
        except ValueError as exc:
            raise ToolError("invalid_arguments", f"the tool's command environment: {exc}") from exc
    result = run_sandboxed(workspace=ctx.workspace, command=ctx.arguments["command"],
                           cwd=ctx.arguments.get("cwd", "."), policy=policy, should_cancel=ctx.should_cancel,
                           live=ctx.live, env=ctx.env)
    after = workspace_manifest(ctx.workspace, reuse=before)
    diff = manifest_diff(before, after)
    changes = {key: diff[key] for key in ("created", "modified", "deleted")}
    published = published_from_changes(ctx.workspace, changes["created"] + changes["modified"])
    output = cap_text(_combined_output(result.stdout, result.stderr), limit=2 * policy.output_cap_bytes + 200)
    data = {"backend": result.backend, "network": policy.network, "timeout_seconds": timeout,
            "timeout_capped": bool(requested and int(requested) > ctx.timeout_seconds),
            "stdout_bytes": result.stdout_bytes, "stderr_bytes": result.stderr_bytes,
            "stdout_truncated_bytes": result.stdout_truncated_bytes,
            "stderr_truncated_bytes": result.stderr_truncated_bytes,
            "limits_hit": result.limits_hit, "manifest_truncated": diff["truncated"]}
    if result.error_code:
        return ToolResult(status="failed", output=output, exit_code=result.exit_code, files_changed=changes,
                          published_files=published, error_code=result.error_code,
                          error_message=result.error_message, data=data)
    return ToolResult(status="completed", output=output, exit_code=result.exit_code, files_changed=changes,
                      published_files=published, data=data)


def max_tool_timeout() -> int:
    return int(getattr(settings, "AGENTOPS_MAX_TOOL_TIMEOUT", 3600))
