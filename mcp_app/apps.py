from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from tools_app.builtin import ToolResult
    from tools_app.runners import ToolRun


class McpAppConfig(AppConfig):
    name = "mcp_app"
    verbose_name = "MCP servers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tools_app.models import ToolKind
        from tools_app.runners import tool_runner_register

        tool_runner_register(ToolKind.MCP, _mcp_tool_run)  # the engine calls MCP tools through it


def _mcp_tool_run(run: "ToolRun") -> "ToolResult":
    """``mcp_app.runner.mcp_tool_run``, imported at the first MCP call: the mcp SDK costs every
    process that loads Django ~0.4 s of CPU at start, and only a sandbox worker calls a server."""
    from mcp_app.runner import mcp_tool_run

    return mcp_tool_run(run)
