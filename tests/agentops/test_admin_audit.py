"""Defects an outside-in audit of the Django admin found (2026-12-04: every add and change page
and action driven as a superuser and as a staff user with view permissions only)."""

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from agentops.models import ApiToken
from hosts_app.models import SandboxHost
from notify_app.models import WebhookEndpoint
from tests import factories
from tests.helpers import api_token
from vault_app.models import Secret

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(db: None) -> Client:
    client = Client()
    client.force_login(factories.user("root", is_superuser=True, is_staff=True, teams=[]))
    return client


def test_a_secret_the_vault_refuses_is_shown_on_the_form_not_as_added(admin_client: Client) -> None:
    """A value under 8 characters: the red refusal and a green "added successfully" with a link to
    a secret that did not exist."""
    team = factories.team("ops")
    response = admin_client.post("/admin/vault_app/secret/add/", {
        "team": team.pk, "name": "short_one", "value": "short", "allowed_tools": "[]", "description": ""})
    assert response.status_code == 200  # the form again, with the error on the field
    page = response.content.decode()
    assert "at least 8 characters" in page and "added successfully" not in page
    assert not Secret.objects.exists()
    for field, value, message in (("name", "Bad Name", "lower-case letters"),
                                  ("allowed_tools", '[""]', "tool names or glob patterns")):
        form = {"team": team.pk, "name": "ok_name", "value": "long-enough-value", "allowed_tools": "[]",
                "description": "", field: value}
        assert message in admin_client.post("/admin/vault_app/secret/add/", form).content.decode()
    assert not Secret.objects.exists()


def test_the_webhook_secret_is_write_only(admin_client: Client) -> None:
    endpoint = WebhookEndpoint.objects.create(team=factories.team("ops"), name="hook", url="https://example.org/h",
                                              secret="whsec_TOPSECRET_123")
    url = f"/admin/notify_app/webhookendpoint/{endpoint.pk}/change/"
    assert "whsec_TOPSECRET_123" not in admin_client.get(url).content.decode()
    kept = admin_client.post(url, {"team": endpoint.team_id, "name": "renamed", "url": endpoint.url, "secret": "",
                                   "events": "[]", "enabled": "on"})
    assert kept.status_code == 302, kept.content.decode()[:2000]
    endpoint.refresh_from_db()
    assert (endpoint.name, endpoint.secret) == ("renamed", "whsec_TOPSECRET_123")  # left empty: kept
    admin_client.post(url, {"team": endpoint.team_id, "name": "renamed", "url": endpoint.url, "secret": "whsec_new",
                            "events": "[]", "enabled": "on"})
    endpoint.refresh_from_db()
    assert endpoint.secret == "whsec_new"


def test_sandbox_hosts_show_no_signing_key_and_make_no_runner(admin_client: Client) -> None:
    runner = SandboxHost.objects.create(name="cust", kind=SandboxHost.Kind.RUNNER, team=factories.team("ops"),
                                        token_hash="0" * 64, public_key="ab12" * 10)
    page = admin_client.get(f"/admin/hosts_app/sandboxhost/{runner.pk}/change/").content.decode()
    assert "ab12ab12" not in page and "Signs its jobs" in page
    add = admin_client.get("/admin/hosts_app/sandboxhost/add/").content.decode()
    assert 'value="runner"' not in add and "POST /api/runners" in add
    refused = admin_client.post("/admin/hosts_app/sandboxhost/add/", {
        "name": "mine", "kind": "runner", "pool": "default", "labels": "[]", "capacity": 4})
    assert refused.status_code == 200 and not SandboxHost.objects.filter(name="mine").exists()  # not a 500


@pytest.mark.parametrize("path", ["/admin/hosts_app/sessionplacement/add/", "/admin/hosts_app/runnerresult/add/",
                                  "/admin/sessions_app/agentsession/add/"])
def test_add_pages_that_could_only_fail_or_skip_the_services_are_gone(admin_client: Client, path: str) -> None:
    assert admin_client.get(path).status_code == 403


def test_a_staff_user_who_may_only_view_tokens_cannot_revoke_them(db: None) -> None:
    owner = factories.user("owner")
    api_token(owner)
    viewer = factories.user("viewer", is_staff=True, teams=[])
    viewer.user_permissions.add(Permission.objects.get(codename="view_apitoken"))
    client = Client()
    client.force_login(viewer)
    token = ApiToken.objects.get(user=owner)
    listing = client.get("/admin/agentops/apitoken/").content.decode()
    assert "revoke_tokens" not in listing
    response = client.post("/admin/agentops/apitoken/", {"action": "revoke_tokens", "_selected_action": [token.pk]})
    assert response.status_code in (200, 302)
    token.refresh_from_db()
    assert token.revoked_at is None
    assert isinstance(owner, User)


@pytest.mark.parametrize("raw", ['[{"path": "a", "op": "gt", "value": NaN}]',
                                 '[{"path": "a", "op": "gt", "value": 1e400}]',
                                 '[{"path": "a", "op": "eq", "value": "\\u0000"}]'])
def test_json_the_database_cannot_hold_is_refused_on_the_form(admin_client: Client, raw: str) -> None:
    """NaN, Infinity and NUL passed Django's JSON reading and failed the save: a 500 on SQLite's
    JSON check and PostgreSQL's json type, on every admin JSON field."""
    from approvals_app.models import ApprovalPolicy

    response = admin_client.post("/admin/approvals_app/approvalpolicy/add/", {
        "name": "p", "position": 1, "tool_name": "run_command", "conditions": raw, "mode": "mutating",
        "risk": "high", "required_approvals": 1, "enabled": "on"})
    assert response.status_code == 200 and "Enter valid JSON" in response.content.decode()
    assert not ApprovalPolicy.objects.exists()
    labels = admin_client.post("/admin/hosts_app/sandboxhost/add/", {
        "name": "h", "kind": "hosted", "pool": "default", "labels": "[NaN]", "capacity": 4})
    assert labels.status_code == 200 and "Enter valid JSON" in labels.content.decode()


@pytest.mark.parametrize(("fields", "field"), [
    ({"command": '"python3 server.py"'}, "command"), ({"command": "[]"}, "command"), ({"command": "[1, 2]"}, "command"),
    ({"mounts": '["relative/path"]'}, "mounts"), ({"mounts": '["/etc"]'}, "mounts"),
    ({"env": '{"A B": "x"}'}, "env"), ({"env": '{"A": 1}'}, "env"), ({"headers": "[1]"}, "headers"),
    ({"transport": "http", "url": ""}, "url"),
])
def test_an_mcp_server_that_cannot_be_reached_is_refused_on_the_form(admin_client: Client, fields: dict[str, str],
                                                                    field: str) -> None:
    """Each saved fine and failed at discovery (a string command ran character by character;
    headers that were a list: a 500)."""
    from mcp_app.models import McpServer

    form = {"team": factories.team("ops").pk, "name": "tracker", "transport": "stdio",
            "command": '["python3", "/srv/server.py"]', "mounts": "[]", "url": "", "headers": "{}", "env": "{}",
            "network": "none", "timeout_seconds": 30, "enabled": "on", **fields,
            "tools-TOTAL_FORMS": 0, "tools-INITIAL_FORMS": 0}
    response = admin_client.post("/admin/mcp_app/mcpserver/add/", form)
    assert response.status_code == 200, response.status_code
    assert response.context["adminform"].form.errors.get(field), response.context["adminform"].form.errors
    assert not McpServer.objects.exists()


def test_discovery_of_a_server_naming_a_missing_secret_is_an_error_message_not_a_500(admin_client: Client) -> None:
    from mcp_app.models import McpServer

    server = McpServer.objects.create(team=factories.team("ops"), name="tracker", command=["python3", "/srv/x.py"],
                                      env={"TOKEN": "{{secret:does_not_exist}}"})
    response = admin_client.post("/admin/mcp_app/mcpserver/", {"action": "refresh_tools",
                                                                "_selected_action": [server.pk]}, follow=True)
    assert response.status_code == 200
    assert "does_not_exist" in response.content.decode()
    server.refresh_from_db()
    assert server.status == McpServer.Status.ERROR


@pytest.mark.parametrize(("field", "value"), [("base_url", "not a url"), ("base_url", "file:///etc/passwd"),
                                              ("starter_files", '{"../../etc/x": "y"}'),
                                              ("starter_files", '{"/etc/passwd": "y"}'), ("metadata", "[1, 2]")])
def test_an_agent_the_engine_would_silently_mishandle_is_refused(admin_client: Client, field: str,
                                                                 value: str) -> None:
    """A bad base URL failed every session with "APIConnectionError"; starter files outside the
    workspace were skipped without a word; metadata is documented as key/value pairs."""
    from sessions_app.models import AgentProfile

    form = {"name": "Bad", "slug": "bad", "team": factories.team("ops").pk, "model": "m", "base_url": "",
            "api_key_env": "", "instructions": "", "starter_files": "{}", "metadata": "{}", "enabled": "on",
            "max_tool_calls": 5, "max_model_calls": "", "max_tokens": "", "max_wall_seconds": "",
            "keep_recent_steps": 6, "verification_rounds": 2, field: value}
    response = admin_client.post("/admin/sessions_app/agentprofile/add/", form)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors.get(field), response.context["adminform"].form.errors
    assert not AgentProfile.objects.filter(slug="bad").exists()


def test_deleting_an_mcp_server_disables_the_tools_it_provided(admin_client: Client) -> None:
    from mcp_app.models import McpServer, McpTool
    from tools_app.models import ToolDefinition

    server = McpServer.objects.create(team=factories.team("ops"), name="tracker", command=["python3", "/srv/x.py"])
    definition = ToolDefinition.objects.create(name="tracker__open", kind="mcp")
    McpTool.objects.create(server=server, definition=definition, remote_name="open", schema_sha256="0" * 64)
    response = admin_client.post(f"/admin/mcp_app/mcpserver/{server.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not McpServer.objects.exists()
    definition.refresh_from_db()
    assert definition.enabled is False


def test_an_agent_is_not_given_another_teams_mcp_tools(admin_client: Client) -> None:
    """A tenancy audit attached another team's MCP tools to an agent: each call was refused at run
    time, naming the other team's server. The admin form refuses them."""
    from mcp_app.models import McpServer, McpTool
    from sessions_app.models import AgentProfile
    from tools_app.models import ToolDefinition

    theirs = McpServer.objects.create(team=factories.team("acme"), name="tracker", command=["python3", "/srv/x.py"])
    ours = McpServer.objects.create(team=factories.team("ops"), name="wiki", command=["python3", "/srv/y.py"])
    tools = []
    for server, name in ((theirs, "tracker__open"), (ours, "wiki__read")):
        definition = ToolDefinition.objects.create(name=name, kind="mcp")
        McpTool.objects.create(server=server, definition=definition, remote_name=name.split("__")[1],
                               schema_sha256="0" * 64)
        tools.append(definition)
    form = {"name": "Ops", "slug": "ops-agent", "team": factories.team("ops").pk, "model": "m", "base_url": "",
            "instructions": "", "starter_files": "{}", "metadata": "{}", "enabled": "on",
            "max_tool_calls": 5, "max_model_calls": "", "max_tokens": "", "max_wall_seconds": "",
            "keep_recent_steps": 6, "verification_rounds": 2, "tools": [t.pk for t in tools],
            "api_key_env": "OPENAI_API_KEY", "compaction_threshold": 0.8}
    response = admin_client.post("/admin/sessions_app/agentprofile/add/", form)
    assert response.status_code == 200
    assert "tracker__open" in str(response.context["adminform"].form.errors.get("tools"))
    assert not AgentProfile.objects.filter(slug="ops-agent").exists()
    form["tools"] = [tools[1].pk]
    saved = admin_client.post("/admin/sessions_app/agentprofile/add/", form)
    assert saved.status_code == 302, saved.context["adminform"].form.errors
    assert list(AgentProfile.objects.get(slug="ops-agent").tools.values_list("name", flat=True)) == ["wiki__read"]
