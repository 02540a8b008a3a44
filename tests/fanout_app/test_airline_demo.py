"""The airline rebooking desk, played by the scripted model on real workers: a batch of two cases,
two subagents each, the recommendation verified in the sandbox, the rebooking waiting for a human."""

import json
from typing import Any

import pytest
from django.test import Client

from approvals_app.models import ApprovalRequest
from fanout_app.demo_airline import airline_agent_seed, airline_batch_start
from fanout_app.models import SubagentLink
from sessions_app.models import Artifact, Step, Turn
from tests import factories
from tests.helpers import finished
from tests.waiting import wait_for
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.usefixtures("workers")


def _approve(client: Client, approval: ApprovalRequest) -> None:
    response = client.post(f"/api/approvals/{approval.request_id}/decision",
                           json.dumps({"decision": "approve", "arguments_sha256": approval.arguments_sha256}),
                           content_type="application/json")
    assert response.status_code == 200, response.content


def _pending(tool: str, n: int) -> list[ApprovalRequest]:
    def found() -> list[ApprovalRequest] | None:
        rows = list(ApprovalRequest.objects.filter(tool_name=tool, status="pending").order_by("created_at"))
        return rows if len(rows) >= n else None

    result: list[ApprovalRequest] = wait_for(found, 90, f"{n} pending {tool}")
    return result


def test_airline_desk_rebooks_both_cases_after_a_human_approves(scripted_model_url: str,
                                                                 transactional_db: Any) -> None:
    tool_definitions_seed()
    operator = factories.user("operator", groups=["operators"], teams=["demo"])
    reviewer = factories.user("reviewer", groups=["reviewers"], teams=["demo"])
    airline_agent_seed(team=factories.team("demo"), base_url=scripted_model_url, model="scripted-demo")
    batch = airline_batch_start(owner=operator)
    client = Client()
    client.force_login(reviewer)
    for tool in ("run_command", "hold_seats"):
        for approval in _pending(tool, 2):
            _approve(client, approval)
    rebookings = _pending("rebook_passengers", 2)
    page = client.get(f"/approvals/{rebookings[0].request_id}/").content.decode()
    assert "rebooking-passengers" in page and "DL 2290" in page + client.get(
        f"/approvals/{rebookings[1].request_id}/").content.decode()
    for approval in rebookings:
        _approve(client, approval)
    turns = [finished(Turn.objects.get(session__batch_member=m), timeout=90) for m in batch.members.all()]
    assert [t.status for t in turns] == ["completed", "completed"], [(t.error_code, t.error_message) for t in turns]
    family = next(t for t in turns if "FAM-4" in t.input)
    assert "UA 412: one seat left" in family.output_text and "cannot sit together" in family.output_text
    assert "DL 2290 seats 14A, 14B, 14C, 14D" in family.output_text
    # Two subagents per case, their verdicts back in the parent's tool result.
    assert SubagentLink.objects.filter(parent_id=family.session_id).count() == 2
    spawned = Step.objects.get(turn=family, tool_name="spawn_subagents").result or {}
    assert [c["status"] for c in spawned["subagents"]] == ["completed", "completed"]
    assert '"flight": "DL 2290", "fits": true' in spawned["subagents"][0]["answer"]
    # The verification script ran in the sandbox and passed; the recommendation is an artifact.
    verify = Step.objects.get(turn=family, tool_name="run_command").result or {}
    assert verify["exit_code"] == 0 and "OK: FAM-4 verified" in verify["output"]
    paths = set(Artifact.objects.filter(session_id=family.session_id).values_list("path", flat=True))
    assert paths == {"outputs/recommendation-FAM-4.json", "outputs/rebooking-FAM-4.json"}
