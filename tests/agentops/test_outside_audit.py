"""Defects an outside-in audit of the JSON APIs found (2026-12-04: every endpoint driven with curl
against ``make run`` and against PostgreSQL): each request is refused with a clear 4xx in the
API's shape, and changes nothing."""

import json
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals_app import services as approval_services
from mcp_app.models import McpServer, McpTool
from sessions_app.models import AgentProfile, AgentSession, Turn
from sessions_app.services import BUDGET_MAX, INPUT_MAX_CHARS, PINNED_MAX_ITEMS
from tests import factories
from tests.helpers import api_client
from tools_app.models import ToolDefinition
from tools_app.services import tool_definitions_seed
from vault_app import crypto
from vault_app.models import Secret

pytestmark = pytest.mark.django_db


def _post(client: Client, path: str, body: Any) -> Any:
    return client.post(path, json.dumps(body), content_type="application/json")


def _error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.content
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "message", "details"}, body
    if code is not None:
        assert body["code"] == code, body
    return body


def _budgets(session: AgentSession) -> dict[str, Any]:
    session.refresh_from_db()
    return {name: getattr(session, name) for name in ("max_tool_calls", "max_model_calls", "max_tokens",
                                                        "max_wall_seconds")}


# --- budgets: a value no column holds --------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [2**31, 2**32 + 5, 2**40, "300000", 4000.0, True, -1])
def test_a_budget_raise_the_column_cannot_hold_or_not_an_integer_is_422(operator: User, agent: AgentProfile,
                                                                          value: Any) -> None:
    """On PostgreSQL Django binds an integer field as 4 bytes: 2**32 + 5 was stored as 5 (a "raise"
    that lowered the budget, answered 200 with the value asked) and 2**40 as 0."""
    session = factories.session(owner=operator, agent=agent)
    AgentSession.objects.filter(pk=session.pk).update(max_wall_seconds=100)  # a limit to raise
    before = _budgets(session)
    response = _post(api_client(operator), f"/api/sessions/{session.id}/budget", {"max_wall_seconds": value})
    _error(response, 422, "invalid_arguments" if value != -1 else None)
    assert _budgets(session) == before


def test_the_largest_budget_is_stored_as_given(operator: User, agent: AgentProfile) -> None:
    session = factories.session(owner=operator, agent=agent)
    AgentSession.objects.filter(pk=session.pk).update(max_tokens=1000)
    response = _post(api_client(operator), f"/api/sessions/{session.id}/budget", {"max_tokens": BUDGET_MAX})
    assert response.status_code == 200, response.content
    assert _budgets(session)["max_tokens"] == BUDGET_MAX == response.json()["budget"]["max_tokens"]


@pytest.mark.parametrize("path", ["/api/sessions", "/api/sessions/batch"])
def test_creating_with_a_budget_over_the_column_is_422_not_500(operator: User, agent: AgentProfile,
                                                               path: str) -> None:
    """2**31 broke the non-negative constraint on PostgreSQL once wrapped: a 500."""
    budget = {"max_tokens": 2**31}
    body = {"agent": agent.slug, "input": "hi", "budget": budget} if path == "/api/sessions" else {
        "agent": agent.slug, "rows": [{"input": "hi", "budget": budget}]}
    body = _error(_post(api_client(operator), path, body), 422, "invalid_arguments")
    assert str(BUDGET_MAX) in body["message"]
    assert not AgentSession.objects.exists()


# --- batches: rows of the wrong shape --------------------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [("pinned", "x"), ("budget", "x"), ("metadata", "x"),
                                              ("pinned", [["requirements", ["x"]]]), ("metadata", [1, 2])])
def test_a_batch_row_whose_object_fields_are_not_objects_is_422(operator: User, agent: AgentProfile,
                                                                field: str, value: Any) -> None:
    """``dict("x")`` raised a ValueError (500); ``dict([[k, v]])`` took a list of pairs as an object."""
    rows = [{"input": "fine"}, {"input": "hi", field: value}]
    body = _error(_post(api_client(operator), "/api/sessions/batch", {"agent": agent.slug, "rows": rows}), 422)
    assert body["message"] == f"row 1: {field} must be an object" and body["details"]["row"] == 1
    assert not AgentSession.objects.exists()


def test_a_batch_row_input_over_the_limit_is_422(operator: User, agent: AgentProfile) -> None:
    rows = [{"input": "x" * (INPUT_MAX_CHARS + 1)}]
    body = _error(_post(api_client(operator), "/api/sessions/batch", {"agent": agent.slug, "rows": rows}), 422)
    assert body["details"] == {"row": 0, "field": "input", "max": INPUT_MAX_CHARS}
    assert not AgentSession.objects.exists()


# --- pinned context: the same rules on create and on edit ------------------------------------------------------------

def test_pinned_context_is_a_list_of_strings_on_create_as_on_edit(operator: User, agent: AgentProfile) -> None:
    client = api_client(operator)
    _error(_post(client, "/api/sessions", {"agent": agent.slug, "pinned": {"requirements": "not a list"}}), 422)
    _error(_post(client, "/api/sessions", {"agent": agent.slug, "pinned": {
        "requirements": ["x"] * (PINNED_MAX_ITEMS + 1)}}), 422)
    _error(_post(client, "/api/sessions", {"agent": agent.slug, "pinned": {"prohibitions": ["x" * 10_001]}}), 422)
    assert not AgentSession.objects.exists()
    created = _post(client, "/api/sessions", {"agent": agent.slug, "pinned": {"requirements": ["be brief"],
                                                                             "prohibitions": ["no network"]}})
    assert created.status_code == 201, created.content
    session_id = created.json()["id"]
    # null clears a field (it was dropped as if left out: a 200 that changed nothing)
    edited = client.put(f"/api/sessions/{session_id}/pinned", json.dumps({"requirements": None}),
                        content_type="application/json")
    assert edited.status_code == 200, edited.content
    assert edited.json()["pinned"] == {"requirements": [], "prohibitions": ["no network"], "acceptance_criteria": []}
    session = AgentSession.objects.get(pk=session_id)
    assert session.requirements == [] and session.prohibitions == ["no network"]


# --- unknown fields are refused, not dropped -------------------------------------------------------------------------

@pytest.fixture
def vault_admin(db: None) -> User:
    return factories.user("vault-admin", is_superuser=True, is_staff=True, teams=[])


def test_unknown_or_contradictory_fields_are_refused(operator: User, agent: AgentProfile, vault_admin: User) -> None:
    _error(_post(api_client(operator), "/api/sessions", {"agent": agent.slug, "input": "hi", "titel": "typo"}), 422)
    _error(_post(api_client(operator), "/api/sessions/batch", {"agent": agent.slug, "rows": [{"input": "hi"}],
                                                               "extra": 1}), 422)
    assert not AgentSession.objects.exists()
    secret = Secret.objects.create(team=factories.team("ops"), name="tok", ciphertext=crypto.encrypt("v" * 16))
    client = api_client(vault_admin)
    for body in ({"name": "renamed"}, {"clear_expiry": True, "expires_at": "2030-01-01T00:00:00Z"}):
        response = client.patch(f"/api/secrets/{secret.pk}", json.dumps(body), content_type="application/json")
        assert response.status_code == 422, (body, response.content)
    secret.refresh_from_db()
    assert secret.name == "tok" and secret.expires_at is None


# --- the OpenAI wire: several inputs, all or none --------------------------------------------------------------------

def test_wire_events_refused_part_way_apply_nothing(operator: User) -> None:
    """A message then an unknown tool call: 400, and the message's turn was created and ran before;
    the SDK retries that 400 and sent the message again."""
    agent = factories.agent_profile()
    session = factories.session(owner=operator, agent=agent)
    response = api_client(operator).post(
        f"/openai/v1/agents/sessions/{session.id}/events", json.dumps({"events": [
            {"type": "agent.session.input.message", "input": "say partial"},
            {"type": "agent.session.input.tool_result", "turn_id": str(uuid.uuid4()), "call_id": "nope",
             "output": "x"}]}), content_type="application/json", HTTP_OPENAI_BETA="agents=v1")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["message"] == "Unknown pending tool call: nope"
    assert not Turn.objects.filter(session=session).exists()
    session.refresh_from_db()
    assert session.status == AgentSession.Status.IDLE


# --- other teams ----------------------------------------------------------------------------------------------------

def test_the_tools_list_hides_other_teams_mcp_tools(operator: User) -> None:
    tool_definitions_seed()
    theirs = McpServer.objects.create(team=factories.team("other"), name="tracker", command=["true"])
    definition = ToolDefinition.objects.create(name="tracker__open_ticket", kind="mcp", description="Opens one.")
    McpTool.objects.create(server=theirs, definition=definition, remote_name="open_ticket", schema_sha256="0" * 64)
    outsider = factories.user("mallory", groups=["operators"], teams=["other"])

    def names(user: User) -> set[str]:
        response = api_client(user).get("/api/tools")
        assert response.status_code == 200, response.content
        return {tool["name"] for tool in response.json()}

    mine, theirs_seen = names(operator), names(outsider)
    assert "tracker__open_ticket" not in mine and "run_command" in mine
    assert "tracker__open_ticket" in theirs_seen and "run_command" in theirs_seen
    # A function (client) tool declared by another team's agent, through the OpenAI wire, with
    # its own description ("ACME-INTERNAL: refund through Stripe account …"): theirs alone.
    refund = ToolDefinition.objects.create(name="acme_refund_customer", kind="client",
                                           description="ACME-INTERNAL: refund through our Stripe account")
    factories.agent_profile(team=factories.team("other")).tools.add(refund)
    unused = ToolDefinition.objects.create(name="declared_by_nobody", kind="client", description="?")
    assert refund.name not in names(operator) and refund.name in names(outsider)
    assert unused.name not in names(operator) and unused.name not in names(outsider)
    factories.agent_profile().tools.add(refund)  # one of the operator's agents declares it too
    assert refund.name in names(operator)


def test_other_teams_are_as_unknown_as_teams_that_do_not_exist(operator: User) -> None:
    factories.team("other")
    client = api_client(operator)
    unknown = _error(client.get("/api/secrets", {"team": "nope"}), 404, "not_found")
    other = _error(client.get("/api/secrets", {"team": "other"}), 404, "not_found")
    assert other["message"] == unknown["message"].replace("nope", "other")
    assert client.get("/api/secrets", {"team": "default"}).status_code == 200


def test_sandbox_hosts_need_a_role(operator: User) -> None:
    nobody = factories.user("nobody", teams=[])
    for path in ("/api/hosts", "/api/hosts/local"):
        _error(api_client(nobody).get(path), 403)
    assert api_client(operator).get("/api/hosts").status_code == 200


# --- messages and shapes ---------------------------------------------------------------------------------------------

def test_a_decision_of_the_wrong_kind_names_the_allowed_ones_plainly(reviewer: User) -> None:
    tool_definitions_seed()
    step = factories.step(factories.turn(factories.session(owner=factories.user(groups=["operators"]))),
                          tool_name="run_command", call_id="call_1", arguments={"command": "ls"})
    approval = approval_services.approval_request_create(step_id=step.id)
    body = _error(_post(api_client(reviewer), f"/api/approvals/{approval.request_id}/decision",
                        {"decision": "retry", "arguments_sha256": approval.arguments_sha256}), 422)
    assert body["message"] == "A tool request takes one of ['approve', 'reject']", body
    assert body["details"]["allowed"] == ["approve", "reject"]


def test_errors_before_any_route_keep_the_apis_shape(operator: User) -> None:
    client = api_client(operator)
    body = _error(client.get("/api/sessions", HTTP_HOST="evil.example"), 400, "bad_request")
    assert "Host header" in body["message"]
    wire = client.get("/openai/v1/agents", HTTP_HOST="evil.example")
    assert wire.status_code == 400 and wire.json()["error"]["code"] == "bad_request"
    page = client.get("/sessions/", HTTP_HOST="evil.example")
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")
