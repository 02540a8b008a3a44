"""The demo seed registers the incident tracker (MCP, stdio) for the demo team, and the incident
responder's scripted demo uses it: list the open tickets, then comment (a reviewer approves)."""

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from approvals_app.models import ApprovalRequest
from mcp_app.models import McpServer
from scripted_model.demo_mcp import TRACKER_COMMENT_TEXT
from sessions_app.engine.commands import session_start
from sessions_app.models import AgentProfile, AgentSession, Step
from tests import factories
from tests.helpers import finished, pending_approvals
from tools_app.models import ApprovalMode, ToolDefinition

pytestmark = pytest.mark.usefixtures("workers")


def test_demo_incident_responder_uses_the_mcp_incident_tracker(scripted_model_url: str, real_sandbox: None) -> None:
    factories.ensure_roles()  # an earlier transactional test flushed the roles' data migration
    call_command("agentops_demo", model_url=scripted_model_url)
    server = McpServer.objects.get(name="tracker")
    assert server.team.slug == "demo" and server.status == McpServer.Status.OK
    modes = dict(ToolDefinition.objects.filter(name__startswith="tracker__").values_list("name", "approval_mode"))
    assert modes == {"tracker__list_tickets": ApprovalMode.SAFE_READONLY,
                     "tracker__open_ticket": ApprovalMode.MUTATING, "tracker__comment_ticket": ApprovalMode.MUTATING}
    agent = AgentProfile.objects.get(slug="incident-responder")
    assert set(modes) <= set(agent.tools.values_list("name", flat=True))
    operator = factories.user("op", groups=["operators"], teams=["demo"])
    reviewer = factories.user("rev", groups=["reviewers"], teams=["demo"])
    session, turn = session_start(agent=agent, owner=operator, input="The payments service is failing.")
    assert turn is not None
    client = Client()
    client.force_login(reviewer)
    for expected in ("run_command", "tracker__comment_ticket"):
        (approval,) = pending_approvals(turn, timeout=90)
        assert approval.tool_name == expected
        page = client.get(f"/approvals/{approval.request_id}/")  # what the reviewer sees
        assert page.status_code == 200 and expected in page.content.decode()
        if expected.startswith("tracker__"):
            assert "MCP server" in page.content.decode() and "INC-101" in page.content.decode()
        response = client.post(f"/api/approvals/{approval.request_id}/decision",
                               json.dumps({"decision": "approve", "arguments_sha256": approval.arguments_sha256}),
                               content_type="application/json")
        assert response.status_code == 200, response.content
    turn = finished(turn, timeout=90)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert "INC-101" in turn.output_text and "PaymentsQueueBacklog" in turn.output_text
    timeline = client.get(f"/sessions/{session.id}/")
    assert timeline.status_code == 200 and "tracker__list_tickets" in timeline.content.decode()
    listing = Step.objects.get(turn=turn, tool_name="tracker__list_tickets")
    assert listing.status == "completed" and not ApprovalRequest.objects.filter(step=listing).exists()
    store = Path(AgentSession.objects.get(pk=session.pk).workspace) / ".incident_tracker.json"
    tickets = {t["id"]: t for t in json.loads(store.read_text())}
    assert tickets["INC-101"]["comments"][-1] == TRACKER_COMMENT_TEXT
