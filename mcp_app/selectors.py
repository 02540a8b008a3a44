"""Reads for mcp_app (team-scoped where a person reads them)."""

from django.db.models import QuerySet

from .models import McpServer, McpTool


def mcp_servers_of_team(team_id: int) -> QuerySet[McpServer]:
    return McpServer.objects.filter(team_id=team_id).order_by("name")


def mcp_tools_of_server(server_id: int) -> QuerySet[McpTool]:
    return McpTool.objects.filter(server_id=server_id).select_related("definition").order_by("remote_name")
