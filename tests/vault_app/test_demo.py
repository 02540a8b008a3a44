"""The demo: `make run` gives the scripted model server a status API token and agentops_demo stores
it in the vault; the incident responder's http_request uses it by reference and gets the status."""

import json
from io import StringIO
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from agentops.models import Team
from approvals_app.models import ApprovalRequest
from sessions_app.engine.commands import session_start
from sessions_app.models import AgentProfile, Step, Turn
from tests import factories
from tests.helpers import finished, pending_approvals
from tests.waiting import wait_for
from vault_app import crypto
from vault_app.models import Secret

TOKEN = "demo-status-token-5f1e2d3c"


@pytest.fixture
def demo_env(monkeypatch: pytest.MonkeyPatch, settings, scripted_model_url: str) -> str:  # type: ignore[no-untyped-def]
    status_url = scripted_model_url.removesuffix("/v1") + "/demo/status"
    monkeypatch.setenv("AGENTOPS_DEMO_STATUS_TOKEN", TOKEN)
    monkeypatch.setenv("AGENTOPS_DEMO_STATUS_URL", status_url)
    settings.AGENTOPS_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.AGENTOPS_HTTP_ALLOW_PRIVATE = True
    return status_url


def test_demo_status_api_wants_the_bearer_token(demo_env: str) -> None:
    assert httpx.get(demo_env).status_code == 401
    assert httpx.get(demo_env, headers={"Authorization": "Bearer wrong"}).status_code == 401
    ok = httpx.get(demo_env, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["status"] == "degraded" and TOKEN not in ok.text


@pytest.mark.usefixtures("workers")
def test_demo_incident_uses_the_vault_secret(demo_env: str, transactional_db: None) -> None:
    factories.ensure_roles()  # a transactional test before this one flushed the roles
    call_command("agentops_demo", "--model-url", demo_env.removesuffix("/demo/status") + "/v1", stdout=StringIO())
    call_command("agentops_demo", "--model-url", demo_env.removesuffix("/demo/status") + "/v1",
                 stdout=StringIO())  # idempotent: the secret is updated, not duplicated
    secret = Secret.objects.get(team__slug="demo", name="status_api_token")
    assert crypto.decrypt(secret.ciphertext) == TOKEN and secret.allowed_tools == ["http_request"]
    agent = AgentProfile.objects.get(slug="incident-responder")
    operator, reviewer = User.objects.get(username="operator"), User.objects.get(username="reviewer")
    assert Team.objects.get(slug="demo").pk == agent.team_id
    session, turn = session_start(agent=agent, owner=operator, input="The payments API returns 503s.")
    assert turn is not None
    client = Client()
    client.force_login(reviewer)
    approved: list[str] = []
    while "run_command" not in approved:  # the status call, the restart (and the tracker comment, with MCP)
        (approval,) = pending_approvals(turn, timeout=60)
        if approval.tool_name == "http_request":
            page = client.get(f"/approvals/{approval.request_id}/").content.decode()
            assert "status_api_token" in page and TOKEN not in page
        response = client.post(f"/api/approvals/{approval.request_id}/decision",
                               json.dumps({"decision": "approve", "arguments_sha256": approval.arguments_sha256}),
                               content_type="application/json")
        assert response.status_code == 200, response.content
        approved.append(approval.tool_name)
        if len(approved) > 5:
            break
    assert approved[:2] == ["http_request", "run_command"], approved
    for _ in range(3):  # with the MCP tracker, its comment is asked after the restart: approve it too
        def next_thing() -> list[ApprovalRequest] | str | None:
            waiting = list(ApprovalRequest.objects.filter(turn=turn, status="pending"))
            return waiting or (None if Turn.objects.get(pk=turn.pk).is_active else "done")

        found = wait_for(next_thing, 60, "a pending approval or the end of the turn")
        if found == "done":
            break
        for approval in found:
            client.post(f"/api/approvals/{approval.request_id}/decision",
                        json.dumps({"decision": "approve", "arguments_sha256": approval.arguments_sha256}),
                        content_type="application/json")
    done = finished(turn, timeout=60)
    assert done.status == "completed", (done.error_code, done.error_message)
    http_step = Step.objects.get(turn=turn, tool_name="http_request")
    result: dict[str, Any] = http_step.result or {}
    assert result["output"].startswith("HTTP 200") and '"status": "degraded"' in result["output"]
    assert ApprovalRequest.objects.filter(session=session, status="consumed").count() >= 2
