from django.apps import AppConfig


class McpAppConfig(AppConfig):
    name = "mcp_app"
    verbose_name = "MCP servers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from mcp_app.runner import mcp_tool_run
        from tools_app.models import ToolKind
        from tools_app.runners import tool_runner_register

        tool_runner_register(ToolKind.MCP, mcp_tool_run)  # the engine calls MCP tools through it
