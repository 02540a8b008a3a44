"""Discovery against real MCP servers: the tools become ToolDefinitions named <server>__<tool>."""

import pytest

from mcp_app.models import McpServer, McpTool
from mcp_app.services import mcp_server_refresh, mcp_tools_apply_suggested_modes
from tools_app.models import ApprovalMode, ToolDefinition


def _assert_discovered(server: McpServer) -> None:
    report = mcp_server_refresh(server_id=server.id)
    assert report.error == ""
    assert sorted(report.created) == [f"{server.name}__{t}" for t in ("lookup", "note", "snapshot", "whoami")]
    lookup = ToolDefinition.objects.get(name=f"{server.name}__lookup")
    assert lookup.kind == ToolDefinition.Kind.MCP
    assert lookup.parameters_schema["required"] == ["key"]
    assert lookup.description.startswith("Look a key up")
    # Annotations only suggest: every new tool is mutating until an admin decides.
    assert lookup.approval_mode == ApprovalMode.MUTATING
    assert McpTool.objects.get(definition=lookup).suggested_mode == ApprovalMode.SAFE_READONLY
    assert McpTool.objects.get(definition__name=f"{server.name}__note").suggested_mode == ApprovalMode.MUTATING
    assert len(lookup.source_version) == 32
    server.refresh_from_db()
    assert server.status == McpServer.Status.OK
    # A second discovery changes nothing.
    again = mcp_server_refresh(server_id=server.id)
    assert again.created == again.changed == again.removed == []


@pytest.mark.django_db
def test_mcp_server_refresh_streamable_http(http_server: McpServer) -> None:
    # (Over stdio, discovery runs in the sandbox: test_runner and test_engine discover that way.)
    _assert_discovered(http_server)
    assert mcp_tools_apply_suggested_modes(server_id=http_server.id) == 2  # lookup, whoami: read-only
    modes = dict(ToolDefinition.objects.filter(kind="mcp").values_list("name", "approval_mode"))
    assert modes == {"fxh__lookup": "safe_readonly", "fxh__whoami": "safe_readonly", "fxh__note": "mutating",
                     "fxh__snapshot": "mutating"}


@pytest.mark.django_db
def test_mcp_server_refresh_never_takes_another_tools_name(http_server: McpServer) -> None:
    ToolDefinition.objects.create(name="fxh__note", kind=ToolDefinition.Kind.CLIENT,
                                  parameters_schema={"type": "object"})
    report = mcp_server_refresh(server_id=http_server.id)
    assert report.skipped == ["fxh__note"] and "fxh__note" not in report.created
    assert ToolDefinition.objects.get(name="fxh__note").kind == ToolDefinition.Kind.CLIENT


@pytest.mark.django_db
def test_mcp_server_refresh_down_is_an_admin_visible_error(db: None) -> None:
    from tests import factories

    server = McpServer.objects.create(team=factories.team(), name="gone", transport=McpServer.Transport.HTTP,
                                      url="http://127.0.0.1:9/mcp", timeout_seconds=3)
    report = mcp_server_refresh(server_id=server.id)
    server.refresh_from_db()
    assert server.status == McpServer.Status.ERROR
    assert "gone" in report.error and server.status_message == report.error
    assert not ToolDefinition.objects.filter(name__startswith="gone__").exists()
