from typing import Any

from ninja import Router

from agentops.api import ERRORS
from agentops.http import AuthedRequest
from agentops.permissions import VIEW_TOOLS, require_perm
from mcp_app.schemas import McpServerOut
from mcp_app.selectors import mcp_servers_visible

router = Router(tags=["mcp"])


@router.get("/mcp/servers", response={200: list[McpServerOut], **ERRORS})
def mcp_servers_list_api(request: AuthedRequest) -> list[dict[str, Any]]:
    """The MCP servers of the caller's teams, with their last status and tools (no command, URL,
    headers or environment: those are the admin's)."""
    require_perm(request.user, VIEW_TOOLS)
    return [{"name": s.name, "team": s.team.slug, "transport": s.transport, "enabled": s.enabled,
             "status": s.status, "status_message": s.status_message, "checked_at": s.checked_at,
             "tools": [{"name": t.definition.name, "remote_name": t.remote_name,
                        "approval_mode": t.definition.approval_mode, "suggested_mode": t.suggested_mode,
                        "present": t.present} for t in s.tools.all()]}
            for s in mcp_servers_visible(user=request.user)]
