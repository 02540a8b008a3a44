"""GET /api/mcp/servers: the servers of the caller's teams with status and tools, nothing else."""

from typing import Any

import pytest

from mcp_app.models import McpServer, McpTool
from tests import factories
from tests.helpers import api_client
from tools_app.models import ToolDefinition


def _server(team: str, name: str, tools: int) -> McpServer:
    server = McpServer.objects.create(team=factories.team(team), name=name, transport="http", url="http://x/mcp",
                                      headers={"Authorization": "Bearer {{secret:T}}"}, status="error",
                                      status_message="down")
    for i in range(tools):
        definition = ToolDefinition.objects.create(name=f"{name}__t{i}", kind="mcp",
                                                   parameters_schema={"type": "object"})
        McpTool.objects.create(server=server, definition=definition, remote_name=f"t{i}", schema_sha256="x",
                               suggested_mode="safe_readonly")
    return server


@pytest.mark.django_db
def test_mcp_servers_list_api_is_team_scoped(django_assert_num_queries: Any) -> None:
    _server("default", "mine", 3)
    _server("default", "mine2", 1)
    _server("other", "theirs", 2)
    client = api_client(factories.user("op", groups=["operators"]))
    with django_assert_num_queries(4):  # token, permissions (one read), servers, tools
        response = client.get("/api/mcp/servers")
    assert response.status_code == 200, response.content
    body = response.json()
    assert [s["name"] for s in body] == ["mine", "mine2"]
    assert body[0]["status"] == "error" and body[0]["status_message"] == "down"
    assert [t["name"] for t in body[0]["tools"]] == ["mine__t0", "mine__t1", "mine__t2"]
    first = body[0]["tools"][0]
    assert first["approval_mode"] == "mutating" and first["suggested_mode"] == "safe_readonly"
    assert "headers" not in body[0] and "secret" not in response.content.decode()
