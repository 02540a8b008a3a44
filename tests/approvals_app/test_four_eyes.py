"""Four-eyes on every path: nobody decides a call their own input produced, nor on their own
session; edits keep both versions and the editor; the audit trail records page views and
outlives the session."""

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agentops.domain import NotFound
from approvals_app import services
from approvals_app.models import ApprovalAudit, ApprovalRequest
from sessions_app import services as session_services
from sessions_app.models import AgentSession
from tests import factories
from tests.helpers import api_client, login
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db


def _request_from_input_of(author: User, *, owner: User | None = None) -> ApprovalRequest:
    """A pending run_command request produced by a turn whose input ``author`` submitted to a
    session ``owner`` started."""
    tool_definitions_seed()
    session = factories.session(owner=owner or factories.user(groups=["operators"]))
    turn = session_services.turn_create(session_id=session.id, input="clean the build", actor=author)
    step = factories.step(turn, tool_name="run_command", call_id=f"call_{uuid.uuid4().hex[:8]}",
                          arguments={"command": "rm -rf build"}, approval_mode="mutating")
    return services.approval_request_create(step_id=step.id)


def _both() -> User:
    """Operator and reviewer of the team: every admin is one."""
    return factories.user(groups=["operators", "reviewers"])


def _post_api(client: Client, approval: ApprovalRequest, **body: Any) -> Any:
    return client.post(f"/api/approvals/{approval.request_id}/decision",
                       {"decision": "approve", "arguments_sha256": approval.arguments_sha256, **body},
                       content_type="application/json")


def _refused(approval: ApprovalRequest, author: User) -> None:
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert ApprovalAudit.objects.filter(request_id=approval.request_id, actor=author, action="refused").exists()


def test_the_author_of_the_input_cannot_approve_through_the_api() -> None:
    author = _both()
    approval = _request_from_input_of(author)  # someone else's session
    response = _post_api(api_client(author), approval)
    assert response.status_code == 403
    assert response.json()["code"] == "self_approval_forbidden"
    assert response.json()["details"]["reason"] == "turn_author"
    _refused(approval, author)


def test_the_author_of_the_input_cannot_approve_through_the_page_or_htmx() -> None:
    author = _both()
    approval = _request_from_input_of(author)
    browser = login(author)
    page = browser.get(f"/approvals/{approval.request_id}/")
    assert b"Approve exactly these arguments" not in page.content
    form = {"decision": "approve", "arguments_sha256": approval.arguments_sha256}
    assert browser.post(f"/approvals/{approval.request_id}/decide/", form).status_code == 403
    htmx = browser.post(f"/approvals/{approval.request_id}/decide/", {**form, "from": "queue"},
                        headers={"HX-Request": "true"})
    assert htmx.status_code == 403
    _refused(approval, author)


def test_the_session_owner_cannot_decide_even_input_someone_else_wrote() -> None:
    owner = _both()
    approval = _request_from_input_of(factories.user(groups=["operators"]), owner=owner)
    response = _post_api(api_client(owner), approval, decision="reject", reason="no")
    assert response.status_code == 403
    assert response.json()["details"]["reason"] == "session_owner"
    _refused(approval, owner)


def test_another_reviewer_decides(reviewer: User) -> None:
    approval = _request_from_input_of(_both())
    assert _post_api(api_client(reviewer), approval).status_code == 200


def test_single_user_installs_turn_four_eyes_off(settings: Any) -> None:
    settings.AGENTOPS_FORBID_SELF_APPROVAL = False
    author = _both()
    approval = _request_from_input_of(author, owner=author)
    assert _post_api(api_client(author), approval).status_code == 200


def test_a_reviewer_of_another_team_finds_no_such_request_on_every_path() -> None:
    """The service itself scopes the request to the actor's teams (the API, the page, bulk approval
    and the OpenAI-style wire all decide through it): another team's request is missing, not
    forbidden, and the refusal changes nothing."""
    approval = _request_from_input_of(factories.user(groups=["operators"]))
    outsider = factories.user(groups=["reviewers"], teams=["other"])
    with pytest.raises(NotFound):
        services.approval_decide(request_id=approval.request_id, actor=outsider, decision="approve")
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING and approval.decided_by is None
    assert not ApprovalAudit.objects.filter(request_id=approval.request_id).exists()
    assert _post_api(api_client(outsider), approval).status_code == 404


def test_a_reviewer_of_the_team_only_as_operator_cannot_decide() -> None:
    approval = _request_from_input_of(factories.user(groups=["operators"]))
    # Globally a reviewer, but an operator in this team.
    user = factories.user(groups=["reviewers"], role="operator")
    response = _post_api(api_client(user), approval)
    assert response.status_code == 403 and response.json()["code"] == "team_role_required"


def test_edited_then_approved_keeps_both_versions_and_the_editor(reviewer: User) -> None:
    approval = _request_from_input_of(factories.user(groups=["operators"]))
    edited = {"command": "rm -rf build/tmp"}
    body = _post_api(api_client(reviewer), approval, arguments=edited).json()
    assert body["arguments"] == {"command": "rm -rf build"}
    assert body["edited_arguments"] == edited
    assert body["edited_by"] == reviewer.username
    row = ApprovalAudit.objects.get(request_id=approval.request_id, action="edited")
    assert row.actor == reviewer
    assert row.details == {"original": {"command": "rm -rf build"}, "edited": edited}


def test_opening_the_page_is_audited_and_the_trail_outlives_the_session(reviewer: User) -> None:
    approval = _request_from_input_of(factories.user(groups=["operators"]))
    page = login(reviewer).get(f"/approvals/{approval.request_id}/")
    assert page.status_code == 200
    viewed = ApprovalAudit.objects.get(request_id=approval.request_id, action="viewed")
    assert viewed.actor_username == reviewer.username
    assert reviewer.username in page.content.decode().split('id="audit"')[1]
    _post_api(api_client(reviewer), approval, decision="reject", reason="not now")
    AgentSession.objects.filter(pk=approval.session_id).delete()
    assert not ApprovalRequest.objects.filter(request_id=approval.request_id).exists()
    assert list(ApprovalAudit.objects.filter(request_id=approval.request_id)
                .values_list("action", flat=True)) == ["viewed", "decided"]
