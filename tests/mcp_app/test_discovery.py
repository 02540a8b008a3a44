"""Discovery against real MCP servers: the tools become ToolDefinitions named <server>__<tool>."""

import pytest
from django.test import Client

from mcp_app.models import McpServer, McpTool
from mcp_app.services import mcp_server_refresh, mcp_tools_apply_suggested_modes
from tests import factories
from tests.mcp_app.conftest import HERE
from tools_app.models import ApprovalMode, ToolDefinition


@pytest.fixture
def admin_client(db: None) -> Client:
    client = Client()
    client.force_login(factories.user("root", is_superuser=True, is_staff=True, teams=[]))
    return client


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
    server = McpServer.objects.create(team=factories.team(), name="gone", transport=McpServer.Transport.HTTP,
                                      url="http://127.0.0.1:9/mcp", timeout_seconds=3)
    report = mcp_server_refresh(server_id=server.id)
    server.refresh_from_db()
    assert server.status == McpServer.Status.ERROR
    assert "gone" in report.error and server.status_message == report.error
    assert not ToolDefinition.objects.filter(name__startswith="gone__").exists()


def test_mcp_tools_whose_names_collide_are_skipped_with_a_note(admin_client: Client, real_sandbox: None) -> None:
    """``a`` listing ``b__c`` and ``a__b`` listing ``c`` are both ``a__b__c``; so are two remote names
    that sanitise or truncate alike. Discovery was a 500 (IntegrityError) in the admin."""
    team = factories.team()
    long = "t" * 70

    def hostile(name: str, tools: str) -> McpServer:
        return McpServer.objects.create(team=team, name=name, transport=McpServer.Transport.STDIO,
                                        command=["python3", str(HERE / "hostile_server.py")], mounts=[str(HERE)],
                                        env={"HOSTILE_TOOLS": tools}, timeout_seconds=20)

    first, second = hostile("a", f"b__c,x.y,x_y,{long}1,{long}2"), hostile("a__b", "c")
    response = admin_client.post("/admin/mcp_app/mcpserver/", {
        "action": "refresh_tools", "_selected_action": [first.pk, second.pk]}, follow=True)
    assert response.status_code == 200
    shown = [str(m.message) for m in response.context["messages"]]
    listed = McpTool.objects.filter(server=second).count()  # the server's own tools, not c
    assert f"a__b: {listed} new, 0 changed, 0 removed, 1 skipped, 0 pending approvals invalidated" in shown, shown
    assert "a__b: skipped 'c': the name a__b__c is already held by tool 'b__c' of MCP server 'a'" in shown, shown
    held = dict(McpTool.objects.values_list("definition__name", "remote_name"))
    assert held["a__b__c"] == "b__c" and held["a__x_y"] == "x.y" and held[f"a__{long}"[:64]] == f"{long}1"
    assert not McpTool.objects.filter(server=second, remote_name="c").exists()
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == second.status == McpServer.Status.OK
    assert "skipped 'x_y': the name a__x_y is already held by tool 'x.y' of MCP server 'a'" in first.status_message
    assert f"skipped '{long}2'" in first.status_message
    assert second.status_message == (f"{listed + 1} tools listed; skipped 'c': the name a__b__c is already held by "
                                     "tool 'b__c' of MCP server 'a'")
    # A second discovery keeps each name where it is.
    assert mcp_server_refresh(server_id=second.id).skipped == ["a__b__c"]
    assert dict(McpTool.objects.values_list("definition__name", "remote_name"))["a__b__c"] == "b__c"


def test_a_tool_name_a_deleted_server_left_is_taken_over_as_new(db: None, real_sandbox: None) -> None:
    """The MCP audit's fixer noticed: a new server whose tool maps to the name a deleted server's
    tool had kept that definition's approval mode (safe_readonly here) and the agents that had
    chosen it, so another server's tool ran unasked in those agents."""
    from mcp_app.services import mcp_server_delete

    team = factories.team()

    def hostile(name: str, tools: str) -> McpServer:
        return McpServer.objects.create(team=team, name=name, transport=McpServer.Transport.STDIO,
                                        command=["python3", str(HERE / "hostile_server.py")], mounts=[str(HERE)],
                                        env={"HOSTILE_TOOLS": tools}, timeout_seconds=20)

    old = hostile("a", "b__c")
    assert "a__b__c" in mcp_server_refresh(server_id=old.id).created
    ToolDefinition.objects.filter(name="a__b__c").update(approval_mode=ApprovalMode.SAFE_READONLY)
    agent = factories.agent_profile(team=team)
    agent.tools.add(ToolDefinition.objects.get(name="a__b__c"))
    mcp_server_delete(server_id=old.id)
    new = hostile("a__b", "c")
    assert "a__b__c" in mcp_server_refresh(server_id=new.id).created
    definition = ToolDefinition.objects.get(name="a__b__c")
    assert definition.approval_mode == ApprovalMode.MUTATING and definition.enabled
    assert not definition.agents.exists()
    assert McpTool.objects.get(definition=definition).server_id == new.id
