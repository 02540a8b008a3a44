import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.test import Client

from agentops.domain import InvalidArguments
from sessions_app.models import AgentProfile, AgentSession, Event
from sessions_app.services import session_create
from tests import factories
from tools_app.models import ToolDefinition


@pytest.mark.django_db
@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"x": {"type": "no-such-type"}}},
    {"type": "string"},
    ["not", "an", "object"],
    {"type": "object", "required": "x"},
])
def test_tool_definition_clean_rejects_invalid_json_schema(schema: object) -> None:
    tool = ToolDefinition(name="bad", parameters_schema=schema)
    with pytest.raises(ValidationError) as info:
        tool.full_clean()
    assert "parameters_schema" in info.value.message_dict


@pytest.mark.django_db
def test_tool_definition_unknown_approval_mode_is_rejected_by_clean_and_database() -> None:
    tool = ToolDefinition(name="odd", approval_mode="yolo", parameters_schema={"type": "object"})
    with pytest.raises(ValidationError) as info:
        tool.full_clean()
    assert "approval_mode" in info.value.message_dict
    with pytest.raises(IntegrityError), transaction.atomic():
        tool.save()
    assert not ToolDefinition.objects.filter(name="odd").exists()


@pytest.mark.django_db
def test_agent_profile_negative_budget_rejected_by_clean_and_database() -> None:
    profile = AgentProfile(name="x", slug="x", max_tool_calls=-1)
    with pytest.raises(ValidationError):
        profile.full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        profile.save()


@pytest.mark.django_db
@pytest.mark.parametrize("budget", [{"max_tool_calls": -1}, {"max_tokens": "many"}, {"unknown": 3},
                                    {"max_tool_calls": True}])
def test_session_create_rejects_bad_budgets_and_writes_nothing(budget: dict[str, object]) -> None:
    agent, owner = factories.agent_profile(), factories.user()
    with pytest.raises(InvalidArguments):
        session_create(agent=agent, owner=owner, budget=budget)
    assert AgentSession.objects.count() == 0 and Event.objects.count() == 0


@pytest.mark.django_db
def test_session_create_rejects_bad_pinned_context() -> None:
    agent, owner = factories.agent_profile(), factories.user()
    with pytest.raises(InvalidArguments):
        session_create(agent=agent, owner=owner, pinned={"requirements": [1, 2]})
    with pytest.raises(InvalidArguments):
        session_create(agent=agent, owner=owner, pinned={"wishes": ["x"]})
    assert AgentSession.objects.count() == 0


@pytest.mark.django_db
def test_admin_pages_load_and_audit_trail_is_read_only(admin_client: Client, admin_user: User) -> None:
    session = factories.session()
    factories.turn(session)
    for url in ["/admin/", "/admin/sessions_app/agentprofile/", "/admin/sessions_app/agentsession/",
                "/admin/sessions_app/turn/", "/admin/sessions_app/step/", "/admin/sessions_app/event/",
                "/admin/sessions_app/artifact/", "/admin/approvals_app/approvalrequest/",
                "/admin/approvals_app/approvalgrant/", "/admin/tools_app/tooldefinition/",
                "/admin/tools_app/outbox/", "/admin/agentops/apitoken/",
                f"/admin/sessions_app/agentsession/{session.pk}/change/"]:
        assert admin_client.get(url).status_code == 200, url
    event = Event.objects.filter(session=session).first()
    assert event is not None
    assert admin_client.get("/admin/sessions_app/event/add/").status_code == 403
    response = admin_client.post(f"/admin/sessions_app/event/{event.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403
    assert Event.objects.filter(pk=event.pk).exists()
