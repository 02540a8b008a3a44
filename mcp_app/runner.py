"""The engine's runner for MCP tools (registered for ``ToolDefinition.kind == "mcp"``).

It runs in the sandbox worker after the engine's gate, approval and claim, like any tool. Per
call: check the team and the server, resolve secret references, connect (stdio: the session's
long-lived server process in the sandbox, started at its first call, see ``mcp_app.pool``; HTTP:
a session with a deadline), check the tool is still what was discovered, call it (cancelled on
the server when the step is cancelled), and turn the reply into a ToolResult. The server's
admin-visible status follows what the call saw.
"""

import logging
import time

from tools_app.builtin import ToolResult
from tools_app.runners import ToolRun

from .client import McpFailure, call_tool
from .models import McpServer, McpTool
from .results import tool_result_from_mcp
from .secret_refs import SecretUnavailable
from .services import mcp_server_status_record, server_connection

log = logging.getLogger(__name__)
# Failures that say the server itself is unwell (admin-visible); a tool's own error is not.
SERVER_FAILURES = {"timeout", "mcp_unavailable", "mcp_connection_lost", "mcp_malformed_result", "mcp_error",
                   "sandbox_error"}


def mcp_tool_run(run: ToolRun) -> ToolResult:
    started = time.monotonic()
    result = _run(run)
    result.duration_ms = round((time.monotonic() - started) * 1000, 3)
    return result


def _run(run: ToolRun) -> ToolResult:
    tool = McpTool.objects.select_related("server").filter(definition__name=run.tool_name).first()
    if tool is None:
        return ToolResult.failure("unknown_tool", f"No MCP server provides {run.tool_name!r} any more.")
    server = tool.server
    if server.team_id != run.team_id:
        return ToolResult.failure("denied", f"The MCP server {server.name!r} belongs to another team.")
    if not server.enabled or not tool.present:
        return ToolResult.failure("tool_unavailable", f"The MCP server {server.name!r} or its tool "
                                                      f"{tool.remote_name!r} is disabled; the call did not run.")
    try:
        conn = server_connection(server, workspace=run.workspace)
    except SecretUnavailable as exc:
        return ToolResult.failure("secret_unavailable", exc.message)
    try:
        reply = call_tool(conn, remote_name=tool.remote_name, arguments=run.arguments,
                          expected_sha256=tool.schema_sha256, session_id=run.session_id,
                          should_cancel=run.should_cancel)
    except McpFailure as exc:
        log.warning("MCP %s.%s failed: %s %s", server.name, tool.remote_name, exc.code, exc.message)
        if exc.code == "mcp_tool_changed":
            mcp_server_status_record(server_id=server.id, status=McpServer.Status.CHANGED, message=exc.message)
        elif exc.code in SERVER_FAILURES:
            mcp_server_status_record(server_id=server.id, status=McpServer.Status.ERROR, message=exc.message)
        return ToolResult.failure(exc.code, exc.message)
    if server.status != McpServer.Status.OK:
        mcp_server_status_record(server_id=server.id, status=McpServer.Status.OK, message="The last call worked.")
    return tool_result_from_mcp(reply, server=server.name, tool=tool.remote_name, workspace=run.workspace,
                                step_id=run.step_id)
