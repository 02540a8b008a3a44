"""The demo team's incident tracker: the MCP server shipped in ``mcp_app/demo`` registered over
stdio (run in the sandbox, one kept process per session), its tools discovered, and the modes an
admin would pick."""

import logging
from pathlib import Path

from agentops.models import Team
from tools_app.models import ToolDefinition

from .models import McpServer, McpTool
from .services import mcp_server_refresh

log = logging.getLogger(__name__)
DEMO_DIR = Path(__file__).resolve().parent / "demo"
DEMO_SERVER = "tracker"


def mcp_demo_tracker_ensure(*, team: Team) -> list[ToolDefinition]:
    """Register (or update) the tracker for ``team`` and discover its tools. Returns the enabled
    tool definitions (empty when discovery failed: the demo then runs without the tracker).

    Newly discovered tools take the server's suggestion (list: safe_readonly; open, comment:
    mutating); a mode an admin changed later is left alone."""
    server, _ = McpServer.objects.update_or_create(
        name=DEMO_SERVER,
        defaults={"team": team, "transport": McpServer.Transport.STDIO,
                  "command": ["python3", str(DEMO_DIR / "incident_tracker.py")], "mounts": [str(DEMO_DIR)],
                  "network": "none", "timeout_seconds": 30, "enabled": True})
    report = mcp_server_refresh(server_id=server.id)
    if report.error:
        log.warning("the demo incident tracker could not be discovered: %s", report.error)
        return []
    for tool in McpTool.objects.filter(server=server, definition__name__in=report.created):
        ToolDefinition.objects.filter(pk=tool.definition_id).update(approval_mode=tool.suggested_mode)
    return list(ToolDefinition.objects.filter(mcp_tool__server=server, enabled=True))
