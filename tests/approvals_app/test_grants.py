"""Remembered approvals are narrow and visible: one session, one tool, exact arguments or a stated
pattern; listed with their uses in the API and on the session page; revocable by any reviewer of
the team (API, page, admin)."""

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals_app import services
from approvals_app.models import ApprovalAudit, ApprovalGrant, ApprovalRequest
from sessions_app.models import Event
from tests import factories
from tests.helpers import api_client, login
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
    return services.grant_use(session_id=approval.session_id, turn_id=approval.turn_id, step_id=step.id,
                              tool_name="write_file", arguments=arguments)


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
