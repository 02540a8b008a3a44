"""Reads for mcp_app (team-scoped where a person reads them)."""

from typing import Any

from django.db.models import Prefetch, QuerySet

from agentops.teams import scope

from .models import McpServer, McpTool


def mcp_servers_visible(*, user: Any) -> QuerySet[McpServer]:
    """The servers of the user's teams with their tools (three queries, whatever the count)."""
    tools = McpTool.objects.select_related("definition").order_by("remote_name")
    return scope(McpServer.objects.select_related("team"), user).prefetch_related(
        Prefetch("tools", queryset=tools)).order_by("name")
