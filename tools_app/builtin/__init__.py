"""Built-in tools: the registry, argument validation and the single entry point execute_tool()."""

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools_app.sandbox import OutputBatcher, PathDenied, SandboxUnavailable

from .airline import (
    HOLD_SEATS_SCHEMA,
    REBOOK_SCHEMA,
    SEARCH_FLIGHTS_SCHEMA,
    hold_seats,
    rebook_passengers,
    search_flights,
)
from .command import RUN_COMMAND_SCHEMA, max_tool_timeout, policy_for, run_command
from .files import (
    LIST_FILES_SCHEMA,
    PUBLISH_ARTIFACT_SCHEMA,
    READ_FILE_SCHEMA,
    WRITE_FILE_SCHEMA,
    list_files,
    publish_artifact,
    read_file,
    write_file,
    write_file_preview,
)
from .network import (
    HTTP_REQUEST_SCHEMA,
    SEND_EMAIL_SCHEMA,
    http_request,
    http_request_secret_refusal,
    send_email,
)
from .registry import (
    MAX_ARGUMENTS_BYTES,
    BuiltinTool,
    ToolContext,
    ToolError,
    ToolResult,
    cap_text,
    validate_arguments,
)

logger = logging.getLogger(__name__)

BUILTIN_TOOLS: dict[str, BuiltinTool] = {tool.name: tool for tool in (
    BuiltinTool("list_files", "List the files of a directory in the workspace (/workspace).", LIST_FILES_SCHEMA,
                "safe_readonly", timeout_seconds=10, idempotent=True, network="none", needs_sandbox=False,
                handler=list_files),
    BuiltinTool("read_file", "Read a text file from the workspace (size-capped).", READ_FILE_SCHEMA,
                "safe_readonly", timeout_seconds=10, idempotent=True, network="none", needs_sandbox=False,
                handler=read_file),
    BuiltinTool("write_file", "Create or replace a file in the workspace; returns the diff. Files under "
                "outputs/ are published as artifacts.", WRITE_FILE_SCHEMA, "mutating", timeout_seconds=10,
                idempotent=True, network="none", needs_sandbox=False, handler=write_file),
    BuiltinTool("run_command", "Run a shell command (/bin/sh -c) in the session's sandbox, cwd /workspace. "
                "Files written under /workspace/outputs/ are published as artifacts.", RUN_COMMAND_SCHEMA,
                "mutating", timeout_seconds=120, idempotent=False, network="none", needs_sandbox=True,
                handler=run_command),
    BuiltinTool("publish_artifact", "Publish a workspace file as an artifact of this session.",
                PUBLISH_ARTIFACT_SCHEMA, "safe_readonly", timeout_seconds=30, idempotent=True, network="none",
                needs_sandbox=False, handler=publish_artifact),
    BuiltinTool("send_email", "Send an email (through the outbox; sent at most once per call).", SEND_EMAIL_SCHEMA,
                "mutating", timeout_seconds=30, idempotent=True, network="none", needs_sandbox=False,
                handler=send_email),
    # needs_sandbox: it starts no process, but it waits on the network, which an engine tick must not.
    BuiltinTool("http_request", "Make an HTTP request to an allow-listed host.", HTTP_REQUEST_SCHEMA, "mutating",
                timeout_seconds=30, idempotent=False, network="host", needs_sandbox=True, handler=http_request),
    # The airline rebooking desk (the subagents demo; ``airline.py``): the workspace's seat inventory.
    BuiltinTool("search_flights", "Search the candidate flights of the seat inventory (free seats, times).",
                SEARCH_FLIGHTS_SCHEMA, "safe_readonly", timeout_seconds=10, idempotent=True, network="none",
                needs_sandbox=False, handler=search_flights),
    BuiltinTool("hold_seats", "Put seats on hold for a case (reversible: release=true).", HOLD_SEATS_SCHEMA,
                "confirm_once", timeout_seconds=10, idempotent=True, network="none", needs_sandbox=False,
                handler=hold_seats),
    BuiltinTool("rebook_passengers", "Rebook a case's passengers onto a flight and seats (a human decides).",
                REBOOK_SCHEMA, "mutating", timeout_seconds=10, idempotent=True, network="none",
                needs_sandbox=False, handler=rebook_passengers),
)}


# Where a built-in's arguments may reference a secret ({{secret:NAME}}, resolved by the engine at run
# time). Anywhere else (a command line, a file's content, an email body) a reference is refused:
# it would put the value where every process on the host or every reader of the file sees it.
SECRET_ARGUMENT_FIELDS: dict[str, tuple[str, ...]] = {"http_request": ("url", "headers")}
# And where inside those fields they are refused: the reason, or "" (a URL's scheme and host).
SECRET_ARGUMENT_REFUSALS: dict[str, Callable[[dict[str, Any]], str]] = {
    "http_request": http_request_secret_refusal}


def _parse_arguments(arguments: Any) -> tuple[dict[str, Any] | None, str]:
    if isinstance(arguments, bytes | bytearray):
        arguments = bytes(arguments).decode("utf-8", "replace")
    if isinstance(arguments, str):
        if len(arguments) > MAX_ARGUMENTS_BYTES:
            return None, f"the arguments are {len(arguments)} characters; the limit is {MAX_ARGUMENTS_BYTES}"
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return None, f"the arguments are not valid JSON: {exc}"
    if not isinstance(arguments, dict):
        return None, f"the arguments must be a JSON object, not {type(arguments).__name__}"
    try:
        size = len(json.dumps(arguments))
    except (TypeError, ValueError) as exc:
        return None, f"the arguments are not JSON-serialisable: {exc}"
    if size > MAX_ARGUMENTS_BYTES:
        return None, f"the arguments are {size} bytes; the limit is {MAX_ARGUMENTS_BYTES}"
    return arguments, ""


def execute_tool(*, name: str, workspace: Path, arguments: dict[str, Any] | str, timeout_seconds: int | None = None,
                 network: str = "none", idempotency_key: str = "", should_cancel: Callable[[], bool] | None = None,
                 manifest_before: dict[str, Any] | None = None, live: OutputBatcher | None = None,
                 env: dict[str, str] | None = None) -> ToolResult:
    """Validate and run one built-in tool call. Never raises for bad input: it returns a failed result.

    ``timeout_seconds`` and ``network`` come from the ToolDefinition (the admin's settings);
    ``idempotency_key`` is the step's (send_email dedupes on it). ``manifest_before`` lets the engine
    pass the workspace manifest it stored before the call, so run_command does not take it twice.
    ``env`` is the tool's command environment with its secrets resolved (run_command only).
    """
    started = time.monotonic()
    result = _execute(name=name, workspace=workspace, arguments=arguments, timeout_seconds=timeout_seconds,
                      network=network, idempotency_key=idempotency_key, should_cancel=should_cancel,
                      manifest_before=manifest_before, live=live, env=env)
    result.duration_ms = round((time.monotonic() - started) * 1000, 3)
    result.output = cap_text(result.output)
    return result


def _execute(*, name: str, workspace: Path, arguments: dict[str, Any] | str, timeout_seconds: int | None,
             network: str, idempotency_key: str, should_cancel: Callable[[], bool] | None,
             manifest_before: dict[str, Any] | None, live: OutputBatcher | None,
             env: dict[str, str] | None = None) -> ToolResult:
    tool = BUILTIN_TOOLS.get(name)
    if tool is None:
        return ToolResult.failure("unknown_tool", f"no built-in tool named {name[:100]!r}; known: "
                                  + ", ".join(sorted(BUILTIN_TOOLS)))
    parsed, problem = _parse_arguments(arguments)
    if parsed is None:
        return ToolResult.failure("invalid_arguments", problem)
    errors = validate_arguments(name, tool.parameters_schema, parsed)
    if errors:
        return ToolResult.failure("invalid_arguments", f"invalid arguments for {name}: " + "; ".join(errors[:10]),
                                  data={"errors": errors})
    if not Path(workspace).is_dir():
        return ToolResult.failure("sandbox_error", f"the workspace {workspace} does not exist")
    ctx = ToolContext(workspace=Path(workspace), arguments=parsed,
                      timeout_seconds=max(1, min(int(timeout_seconds or tool.timeout_seconds), max_tool_timeout())),
                      network=network, idempotency_key=idempotency_key, should_cancel=should_cancel, live=live,
                      env=env)
    try:
        if tool.handler is run_command:
            return run_command(ctx, manifest_before=manifest_before)
        return tool.handler(ctx)
    except ToolError as exc:
        return ToolResult.failure(exc.code, exc.message)
    except PathDenied as exc:
        return ToolResult.failure("denied", str(exc))
    except SandboxUnavailable as exc:
        logger.error("sandbox unavailable for %s: %s", name, exc)
        return ToolResult.failure("sandbox_error", str(exc))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
        return ToolResult.failure("invalid_arguments", f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
    except OSError as exc:
        logger.warning("tool %s failed with an OS error: %s", name, exc)
        return ToolResult.failure("sandbox_error", f"{name} failed: {exc.strerror or exc}")


__all__ = [
    "BUILTIN_TOOLS",
    "SECRET_ARGUMENT_FIELDS",
    "SECRET_ARGUMENT_REFUSALS",
    "BuiltinTool",
    "ToolResult",
    "execute_tool",
    "policy_for",
    "validate_arguments",
    "write_file_preview",
]
