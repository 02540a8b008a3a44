"""Remembered approvals are narrow and visible: one session, one tool, exact arguments or a stated
pattern; listed with their uses in the API and on the session page; revocable by any reviewer of
the team (API, page, admin)."""

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals_app import grants, services
from approvals_app.models import ApprovalAudit, ApprovalGrant, ApprovalRequest
from sessions_app.models import Event
from tests import factories
from tests.helpers import api_client, login
from tools_app.selectors import tool_definitions_cache_clear
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db
ARGS = {"path": "notes/a.md", "content": "x"}


def _confirm_once(arguments: dict[str, Any] | None = None) -> ApprovalRequest:
    tool_definitions_seed()
    turn = factories.turn(factories.session(owner=factories.user(groups=["operators"])))
    step = factories.step(turn, tool_name="write_file", call_id=f"call_{uuid.uuid4().hex[:8]}",
                          arguments=arguments or ARGS, approval_mode="confirm_once")
    return services.approval_request_create(step_id=step.id)


def _approve(reviewer: User, approval: ApprovalRequest, **body: Any) -> Any:
    return api_client(reviewer).post(f"/api/approvals/{approval.request_id}/decision",
                                     {"decision": "approve", "arguments_sha256": approval.arguments_sha256,
                                      "remember": True, **body}, content_type="application/json")


def _use(approval: ApprovalRequest, arguments: dict[str, Any]) -> ApprovalGrant | None:
    step = factories.step(approval.turn, tool_name="write_file", arguments=arguments)
    return grants.grant_use(session_id=approval.session_id, turn_id=approval.turn_id, step_id=step.id,
                              tool_name="write_file", arguments=arguments,
                              spec=services.approval_spec(tool_name="write_file", arguments=arguments)[0])


def test_grants_are_listed_with_their_uses_and_any_team_reviewer_revokes(reviewer: User) -> None:
    approval = _confirm_once()
    assert _approve(reviewer, approval).status_code == 200
    assert _use(approval, ARGS) is not None
    other_reviewer = factories.user(groups=["reviewers"])
    (listed,) = api_client(other_reviewer).get(f"/api/sessions/{approval.session_id}/grants").json()
    assert listed["uses"] == 1 and listed["live"] is True and listed["tool_name"] == "write_file"
    assert listed["turn_id"] == str(approval.turn_id) and listed["granted_by"] == reviewer.username
    response = api_client(other_reviewer).post(f"/api/grants/{listed['grant_id']}/revoke")
    assert response.status_code == 200
    assert response.json()["live"] is False and response.json()["revoked_by"] == other_reviewer.username
    assert _use(approval, ARGS) is None
    assert Event.objects.filter(session_id=approval.session_id, type="grant.revoked").count() == 1
    assert ApprovalAudit.objects.filter(action="grant_revoked", actor=other_reviewer).count() == 1


def test_revoking_needs_a_reviewer_of_the_team(reviewer: User, operator: User) -> None:
    approval = _confirm_once()
    _approve(reviewer, approval)
    grant = ApprovalGrant.objects.get()
    assert api_client(operator).post(f"/api/grants/{grant.pk}/revoke").status_code == 403
    outsider = factories.user(groups=["reviewers"], teams=["elsewhere"])
    assert api_client(outsider).post(f"/api/grants/{grant.pk}/revoke").status_code == 404
    assert api_client(outsider).get(f"/api/sessions/{approval.session_id}/grants").status_code == 404
    grant.refresh_from_db()
    assert grant.revoked_at is None


def test_a_pattern_grant_is_stated_explicitly_and_must_match_the_call(reviewer: User) -> None:
    approval = _confirm_once()
    wrong = _approve(reviewer, approval, grant_pattern={"path": "docs/*", "content": "*"})
    assert wrong.status_code == 422 and wrong.json()["details"] == {"field": "grant_pattern"}
    assert _approve(reviewer, approval, grant_pattern={"path": "notes/*", "content": "*"}).status_code == 200
    assert _use(approval, {"path": "notes/b.md", "content": "y"}) is not None
    assert _use(approval, {"path": "secrets/b.md", "content": "y"}) is None
    assert _use(approval, {"path": "notes/b.md", "content": "y", "append": True}) is None


def test_the_session_page_lists_grants_and_a_reviewer_revokes_there(reviewer: User) -> None:
    approval = _confirm_once()
    _approve(reviewer, approval)
    grant = ApprovalGrant.objects.get()
    browser = login(factories.user(groups=["reviewers", "operators"]))
    page = browser.get(f"/sessions/{approval.session_id}/").content.decode()
    section = page.split('id="grants"')[1].split("</section>")[0]
    assert "write_file" in section and "0 uses" in section and f"/grants/{grant.pk}/revoke/" in section
    assert browser.post(f"/grants/{grant.pk}/revoke/").status_code == 302
    grant.refresh_from_db()
    assert grant.revoked_at is not None


def test_the_admin_revokes_grants(reviewer: User) -> None:
    approval = _confirm_once()
    _approve(reviewer, approval)
    grant = ApprovalGrant.objects.get()
    admin = factories.user(groups=["admins"], is_staff=True, is_superuser=True)
    response = login(admin).post("/admin/approvals_app/approvalgrant/",
                                 {"action": "revoke", "_selected_action": [grant.pk]})
    assert response.status_code == 302
    grant.refresh_from_db()
    assert grant.revoked_at is not None and grant.revoked_by == admin


def test_a_grant_binds_the_tool_as_approved_and_ends_when_an_admin_changes_it(reviewer: User) -> None:
    """An outside audit: a reviewer remembered run_command (network none); an admin then gave it
    the host network and a secret in its environment, and the same call ran under the grant with
    both, approved by nobody. The gate now ends such a grant and asks a reviewer."""
    from sessions_app.engine.tool_steps import tool_step_gate
    from sessions_app.models import Step
    from tools_app.models import ToolDefinition

    tool_definitions_seed()
    ToolDefinition.objects.filter(name="run_command").update(approval_mode="confirm_once")
    agent = factories.agent_profile()
    agent.tools.set(ToolDefinition.objects.filter(name="run_command"))
    session = factories.session(agent=agent, owner=factories.user(groups=["operators"]))
    turn = factories.turn(session)
    args = {"command": "curl -s http://example.test/"}

    def gate(call_id: str) -> str:
        step = factories.step(turn, tool_name="run_command", call_id=call_id, arguments=args)
        return tool_step_gate(step=step, session=session)

    assert gate("c1") == Step.Status.AWAITING_APPROVAL
    first = ApprovalRequest.objects.get()
    assert first.approval_mode == "confirm_once"
    assert _approve(reviewer, first).status_code == 200
    assert gate("c2") == Step.Status.APPROVED  # the tool as approved: the grant covers the call
    tool = ToolDefinition.objects.get(name="run_command")  # as the admin saves it
    tool.network, tool.env = "host", {"DEPLOY_TARGET": "production"}
    tool.save()
    tool_definitions_cache_clear()  # the engine's 2-s cache of the registry
    assert gate("c3") == Step.Status.AWAITING_APPROVAL  # changed since: a reviewer sees it again
    grant = ApprovalGrant.objects.get()
    assert grant.revoked_at is not None and grant.uses == 1
    assert "env" in grant.revoked_reason and "network" in grant.revoked_reason
    (event,) = Event.objects.filter(session_id=session.id, type="grant.invalidated")
    assert {"env", "network", "tool_version"} <= set(event.payload["changed"])
    page = login(factories.user(groups=["reviewers", "operators"])).get(f"/sessions/{session.id}/").content.decode()
    assert "ended: The tool changed since it was granted" in page.split('id="grants"')[1].split("</section>")[0]


def test_a_policys_confirm_once_can_be_remembered(reviewer: User) -> None:
    """The policy's mode replaces the tool's (README): the request is decided as confirm_once, so
    Remember works (it was refused: 'remember applies only to approving a confirm_once tool')."""
    from approvals_app.models import ApprovalPolicy
    from sessions_app.engine.tool_steps import tool_step_gate
    from tools_app.models import ToolDefinition

    tool_definitions_seed()
    agent = factories.agent_profile()
    agent.tools.set(ToolDefinition.objects.filter(name="run_command"))
    session = factories.session(agent=agent, owner=factories.user(groups=["operators"]))
    ApprovalPolicy.objects.create(name="commands once", team=session.team, tool_name="run_command",
                                  mode="confirm_once")
    turn = factories.turn(session)
    step = factories.step(turn, tool_name="run_command", call_id="c1", arguments={"command": "make test"})
    tool_step_gate(step=step, session=session)
    approval = ApprovalRequest.objects.get()
    assert approval.approval_mode == "confirm_once"
    response = _approve(reviewer, approval)
    assert response.status_code == 200, response.content
    again = factories.step(turn, tool_name="run_command", call_id="c2", arguments={"command": "make test"})
    assert tool_step_gate(step=again, session=session) == "approved"
