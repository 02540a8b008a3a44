"""The wire's subagents, vaults/credentials and environments through the test client: what is
refused (and changes nothing), team scoping, and that a value never leaves."""

import json
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from fanout_app.models import SubagentLink
from hosts_app.models import SandboxHost, SessionPlacement
from sessions_app.engine.commands import session_start
from sessions_app.models import Artifact, Step
from tests import factories
from tests.helpers import api_client
from vault_app.crypto import encrypt
from vault_app.models import Secret

pytestmark = pytest.mark.django_db

VALUE = "tok-0123456789-abcdef"


def _call(client: Client, method: str, path: str, body: Any = None) -> Any:
    return client.generic(method, f"/openai/v1{path}", json.dumps(body or {}), content_type="application/json",
                          HTTP_OPENAI_BETA="agents=v1")


@pytest.fixture
def admin_client(operator: User) -> Client:
    operator.user_permissions.add(*Permission.objects.filter(content_type__app_label="vault_app"))
    return api_client(operator)


@pytest.mark.parametrize(("body", "param"), [
    ({"name": "x1", "auth": {"type": "static_bearer", "mcp_server_url": "https://m", "token": VALUE}}, "auth.type"),
    ({"name": "x1", "auth": {"type": "mcp_oauth", "mcp_server_url": "https://m"}}, "auth.type"),
    ({"name": "x1", "auth": {"type": "environment_variable", "secret_name": "X2", "secret_value": VALUE}},
     "auth.secret_name"),
    ({"name": "x1", "auth": {"type": "environment_variable", "secret_value": VALUE,
                             "networking": {"type": "limited", "allowed_hosts": ["a.b"]}}}, "auth.networking"),
    ({"name": "x1", "metadata": {"owner": "me"}, "auth": {"type": "environment_variable", "secret_value": VALUE}},
     "metadata.owner"),
    ({"name": "x1", "auth": {"type": "environment_variable"}}, "auth.secret_value"),
])
def test_credentials_agentops_cannot_hold_are_refused_and_change_nothing(admin_client: Client, body: dict[str, Any],
                                                                          param: str) -> None:
    response = _call(admin_client, "POST", "/vaults/default/credentials", body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.content
    assert not Secret.objects.exists()


def test_vaults_are_the_callers_teams_and_a_value_never_leaves(admin_client: Client, operator: User) -> None:
    other = factories.team("other")
    foreign = Secret.objects.create(team=other, name="theirs", ciphertext=encrypt(VALUE))
    assert _call(admin_client, "GET", "/vaults/other").status_code == 404
    assert _call(admin_client, "GET", f"/vaults/default/credentials/{foreign.pk}").status_code == 404
    assert _call(admin_client, "GET", f"/vaults/other/credentials/{foreign.pk}").status_code == 404
    assert _call(admin_client, "DELETE", "/vaults/default").json()["error"]["code"] == "unsupported_feature"
    created = _call(admin_client, "POST", "/vaults/default/credentials", {
        "name": "mine", "metadata": {"description": "ci"},
        "auth": {"type": "environment_variable", "secret_value": VALUE}})
    assert created.status_code == 200 and VALUE not in created.content.decode()
    assert created.json()["metadata"] == {"description": "ci"} and created.json()["auth"]["secret_name"] == "mine"
    dup = _call(admin_client, "POST", "/vaults/default/credentials", {
        "name": "mine", "auth": {"type": "environment_variable", "secret_value": VALUE}})
    assert dup.status_code == 409 and dup["x-should-retry"] == "false"
    listed = _call(admin_client, "GET", "/vaults/default/credentials")
    assert [c["name"] for c in listed.json()["data"]] == ["mine"] and VALUE not in listed.content.decode()
    plain = api_client(factories.user("plain", groups=["operators"]))  # no vault_app permission
    refused = _call(plain, "DELETE", f"/vaults/default/credentials/{created.json()['id']}")
    assert refused.status_code == 403 and Secret.objects.count() == 2


def test_subagents_are_the_child_sessions_nested_ones_included(operator: User) -> None:
    agent = factories.agent_profile()
    root, turn = session_start(agent=agent, owner=operator, input="go")
    assert turn is not None
    step = factories.step(turn, tool_name="spawn_subagents", call_id="call_spawn")
    child, child_turn = session_start(agent=agent, owner=operator, input="part 0")
    SubagentLink.objects.create(child=child, parent=root, root=root, parent_step=step, index=0, depth=1,
                                agent_path="a/0", task={"instructions": "Do part 0."})
    nested, _ = session_start(agent=agent, owner=operator, input="part 0.0")
    assert child_turn is not None
    nested_step = factories.step(child_turn, tool_name="spawn_subagents", call_id="call_spawn2")
    SubagentLink.objects.create(child=nested, parent=child, root=root, parent_step=nested_step, index=0, depth=2,
                                agent_path="a/0 › a/0", task={"input": "part 0.0"})
    client = api_client(operator)
    listed = _call(client, "GET", f"/agents/sessions/{root.id}/subagents?order=asc").json()
    assert [s["id"] for s in listed["data"]] == [str(child.id), str(nested.id)]
    assert [s["status"] for s in listed["data"]] == ["active", "active"]  # their turns are queued
    assert listed["data"][1]["agentops_parent_session_id"] == str(child.id)
    assert _call(client, "GET", f"/agents/sessions/{child.id}/subagents").json()["data"] == []  # root's tree only
    assert Step.objects.filter(tool_name="spawn_subagents").count() == 2
    outsider = api_client(factories.user("out", groups=["operators"], teams=["other"]))
    assert _call(outsider, "GET", f"/agents/sessions/{root.id}/subagents/{child.id}").status_code == 404


def test_environments_are_the_visible_sandbox_hosts(operator: User) -> None:
    SandboxHost.objects.create(name="shared-1", kind="hosted", status="online")
    theirs = factories.team("other")
    SandboxHost.objects.create(name="their-runner", kind="runner", team=theirs, status="online", token_hash="x" * 64)
    client = api_client(operator)
    assert [e["id"] for e in _call(client, "GET", "/agents/environments").json()["data"]] == ["shared-1"]
    assert _call(client, "GET", "/agents/environments/shared-1").json()["status"] == "connected"
    assert _call(client, "GET", "/agents/environments/their-runner").status_code == 404
    missing = _call(client, "POST", "/agents/environments", {"environment": {"type": "self_hosted"}})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "agentops_runner"
    reviewer = api_client(factories.user("r2", groups=["reviewers"]))
    refused = _call(reviewer, "POST", "/agents/environments", {"environment": {"type": "self_hosted"},
                                                              "agentops_runner": {"name": "r-x", "team": "default"}})
    assert refused.status_code == 403 and SandboxHost.objects.count() == 2


def test_artifacts_carry_and_filter_by_their_sessions_environment(operator: User) -> None:
    host = SandboxHost.objects.create(name="shared-1", kind="hosted", status="online")
    session = factories.session(owner=operator)
    SessionPlacement.objects.create(session=session, host=host)
    artifact = Artifact.objects.create(session=session, path="outputs/a.txt", size=1, sha256="0" * 64,
                                       storage_path="x/a.txt")
    client = api_client(operator)
    base = f"/agents/sessions/{session.id}/artifacts"
    listed = _call(client, "GET", base).json()["data"]
    assert [(a["id"], a["environment_id"]) for a in listed] == [(str(artifact.id), "shared-1")]
    assert [a["id"] for a in _call(client, "GET", f"{base}?environment_id=shared-1").json()["data"]] == \
        [str(artifact.id)]
    assert _call(client, "GET", f"{base}?environment_id=elsewhere").json()["data"] == []
    assert _call(client, "GET", f"{base}/{artifact.id}").json()["environment_id"] == "shared-1"
