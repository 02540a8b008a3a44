"""Cross-cutting API behaviour: authentication (Bearer token, session + CSRF), permissions, the error
shape, malformed and oversized bodies, and ``Idempotency-Key`` on every POST."""

import json
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentops import idempotency
from agentops.models import ApiToken, IdempotencyRecord
from agentops.services import api_token_create
from approvals_app import services as approvals
from approvals_app.models import ApprovalRequest
from sessions_app.engine import commands
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from sessions_app.services import step_transition
from tests import factories
from tests.helpers import api_client, api_token
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db

UNAUTHORIZED = {"code": "unauthorized", "message": "Authentication required: a Bearer token or a logged-in session.",
                "details": {}}


@dataclass
class World:
    """Something for every endpoint to act on."""

    operator: User
    reviewer: User
    agent: AgentProfile
    idle: AgentSession  # no turn: takes a new one
    busy: AgentSession  # an active turn with a pending approval and a client call waiting for output
    approval: ApprovalRequest
    client_step: Step

    def post_requests(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Every POST endpoint with a valid body, as the operator (reviewer for the decision) sends it."""
        return {
            "session_start": ("/api/sessions", {"agent": self.agent.slug, "input": "hello"}),
            "turn_submit": (f"/api/sessions/{self.idle.id}/turns", {"input": "next"}),
            "session_cancel": (f"/api/sessions/{self.busy.id}/cancel", {}),
            "tool_output": (f"/api/sessions/{self.busy.id}/tool-outputs", {"call_id": "call_client", "output": "ok"}),
            "approval_decide": (f"/api/approvals/{self.approval.request_id}/decision", {"decision": "approve",
                                                                                  "arguments_sha256":
                                                                                  self.approval.arguments_sha256}),
        }

    def caller(self, name: str) -> User:
        return self.reviewer if name == "approval_decide" else self.operator


@pytest.fixture
def world(operator: User, reviewer: User, agent: AgentProfile) -> World:
    tool_definitions_seed()
    idle = factories.session(agent=agent, owner=operator)
    busy = factories.session(agent=agent, owner=operator)
    turn = factories.turn(busy)
    step = factories.step(turn, tool_name="run_command", arguments={"command": "make deploy"},
                          approval_mode="mutating")
    approval = approvals.approval_request_create(step_id=step.id)
    client_step = factories.step(turn, tool_name="ask_client", call_id="call_client")
    step_transition(step_id=client_step.id, to=Step.Status.RUNNING)
    return World(operator, reviewer, agent, idle, busy, approval, client_step)


def _snapshot() -> tuple[int, int, int, int, list[str]]:
    """Everything a POST could change."""
    return (AgentSession.objects.count(), Turn.objects.count(), Event.objects.count(),
            ApprovalRequest.objects.filter(status="pending").count(),
            sorted(Step.objects.values_list("status", flat=True)))


POSTS = ["session_start", "turn_submit", "session_cancel", "tool_output", "approval_decide"]


# --- authentication ----------------------------------------------------------------------------------------------

def test_api_auth_bearer_token_authenticates_the_caller(operator: User, agent: AgentProfile) -> None:
    client = _unused_token_client(operator)
    response = client.post("/api/sessions", {"agent": agent.slug}, content_type="application/json")
    assert response.status_code == 201, response.content
    assert response.json()["owner"] == "op"
    assert AgentSession.objects.get(pk=response.json()["id"]).owner == operator
    assert ApiToken.objects.get(user=operator).last_used_at is not None


@pytest.mark.parametrize("authorization", [None, "Bearer aop_not-a-real-token", "Bearer ", "Basic b3A6cHc=",
                                           "aop_without_scheme"])
@pytest.mark.parametrize("name", POSTS)
def test_api_auth_without_valid_credentials_is_401_and_changes_nothing(world: World, name: str,
                                                                       authorization: str | None) -> None:
    # enforce_csrf_checks as a real client: no credentials is 401, never a CSRF 403
    client = Client(enforce_csrf_checks=True, headers={"Authorization": authorization} if authorization else {})
    path, body = world.post_requests()[name]
    before = _snapshot()
    response = client.post(path, body, content_type="application/json")
    assert response.status_code == 401, response.content
    assert response.json() == UNAUTHORIZED
    assert _snapshot() == before


@pytest.mark.parametrize("path", ["/api/sessions", "/api/approvals", "/api/agents", "/api/tools"])
def test_api_auth_get_without_credentials_is_401(world: World, path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 401 and response.json() == UNAUTHORIZED


def test_api_auth_revoked_token_and_inactive_user_are_401(operator: User) -> None:
    row, token = api_token_create(username=operator.username)
    client = Client(headers={"Authorization": f"Bearer {token}"})
    assert client.get("/api/sessions").status_code == 200
    ApiToken.objects.filter(pk=row.pk).update(revoked_at=timezone.now())
    assert client.get("/api/sessions").status_code == 401

    client = api_client(operator)
    User.objects.filter(pk=operator.pk).update(is_active=False)
    assert client.get("/api/sessions").status_code == 401


def test_api_auth_session_post_needs_the_csrf_token(operator: User, agent: AgentProfile) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.get("/api/sessions").status_code == 200  # safe methods need no token

    key = {"Idempotency-Key": "csrf-1"}
    refused = client.post("/api/sessions", {"agent": agent.slug, "input": "hi"}, content_type="application/json",
                          headers=key)
    assert refused.status_code == 403
    assert refused.json()["code"] == "csrf_failed" and set(refused.json()) == {"code", "message", "details"}
    assert AgentSession.objects.count() == 0

    secret = _get_new_csrf_string()
    client.cookies["csrftoken"] = secret
    wrong = client.post("/api/sessions", {"agent": agent.slug, "input": "hi"}, content_type="application/json",
                        headers={"X-CSRFToken": _get_new_csrf_string()})
    assert wrong.status_code == 403 and AgentSession.objects.count() == 0

    # the same Idempotency-Key again: the refusal did not use it up
    accepted = client.post("/api/sessions", {"agent": agent.slug, "input": "hi"}, content_type="application/json",
                           headers={"X-CSRFToken": secret, **key})
    assert accepted.status_code == 201, accepted.content
    assert AgentSession.objects.get().owner == operator


def test_api_auth_bearer_post_needs_no_csrf_token(operator: User, agent: AgentProfile) -> None:
    client = api_client(operator, enforce_csrf_checks=True)
    response = client.post("/api/sessions", {"agent": agent.slug}, content_type="application/json")
    assert response.status_code == 201
    assert AgentSession.objects.count() == 1


# --- permissions -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("groups", "name"), [([], name) for name in POSTS]
                         + [(["reviewers"], name) for name in POSTS if name != "approval_decide"]
                         + [(["operators"], "approval_decide")])
def test_api_auth_post_without_permission_is_403_and_changes_nothing(world: World, name: str,
                                                                     groups: list[str]) -> None:
    client = api_client(factories.user("nobody", groups=groups))
    path, body = world.post_requests()[name]
    before = _snapshot()
    response = client.post(path, body, content_type="application/json")
    assert response.status_code == 403, response.content
    assert response.json()["code"] == "permission_denied"
    assert _snapshot() == before


def test_idempotency_key_survives_a_permission_refusal(world: World) -> None:
    newcomer = factories.user("newcomer")
    client = api_client(newcomer)
    body = {"agent": world.agent.slug, "input": "hi"}
    headers = {"Idempotency-Key": "after-onboarding"}
    assert client.post("/api/sessions", body, content_type="application/json", headers=headers).status_code == 403
    newcomer.groups.add(*world.operator.groups.all())
    newcomer = User.objects.get(pk=newcomer.pk)  # drop the cached permissions
    response = client.post("/api/sessions", body, content_type="application/json", headers=headers)
    assert response.status_code == 201, response.content
    assert AgentSession.objects.filter(owner=newcomer).count() == 1


def test_api_auth_get_without_permission_is_403(world: World) -> None:
    client = api_client(factories.user("nobody"))
    turn = Turn.objects.get(session=world.busy)
    for path in ("/api/sessions", f"/api/sessions/{world.busy.id}", f"/api/sessions/{world.busy.id}/turns",
                 f"/api/turns/{turn.id}", f"/api/sessions/{world.busy.id}/events",
                 f"/api/sessions/{world.busy.id}/artifacts", f"/api/artifacts/{uuid.uuid4()}/content",
                 "/api/approvals", f"/api/approvals/{world.approval.request_id}", "/api/agents", "/api/tools"):
        response = client.get(path)
        assert response.status_code == 403, path
        assert response.json()["code"] == "permission_denied", path


# --- bad input ---------------------------------------------------------------------------------------------------

DEEPLY_NESTED = b"[" * 100_000 + b"]" * 100_000  # the JSON parser gives up with a RecursionError


@pytest.mark.parametrize("raw", [b"{not json", b'{"agent": "x",}', b"'single quotes'", b'{"agent": "\xff\xfe"}',
                                 DEEPLY_NESTED], ids=["brace", "comma", "quotes", "encoding", "nested"])
@pytest.mark.parametrize("name", [name for name in POSTS if name != "session_cancel"])  # cancel reads no body
def test_api_malformed_json_is_400_and_changes_nothing(world: World, name: str, raw: bytes) -> None:
    path, _ = world.post_requests()[name]
    before = _snapshot()
    response = api_client(world.caller(name)).post(path, raw, content_type="application/json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "malformed_json" and body["message"] == "The request body is not valid JSON."
    assert _snapshot() == before


@pytest.mark.parametrize("name", ["session_start", "turn_submit", "tool_output", "approval_decide"])
def test_api_wrong_types_are_422_with_the_failing_field(world: World, name: str) -> None:
    path, body = world.post_requests()[name]
    first_field = next(iter(body))
    before = _snapshot()
    response = api_client(world.caller(name)).post(path, {**body, first_field: ["wrong", "type"]},
                                                  content_type="application/json")
    assert response.status_code == 422, response.content
    error = response.json()
    assert error["code"] == "invalid_arguments"
    assert error["details"]["errors"][0]["loc"][-1] == first_field
    assert _snapshot() == before


def test_api_oversized_body_is_413_and_creates_nothing(operator: User, agent: AgentProfile, settings: Any) -> None:
    client = api_client(operator)
    limit = settings.AGENTOPS_MAX_REQUEST_BYTES
    assert limit == 1_000_000
    body = json.dumps({"agent": agent.slug, "input": "x" * limit})
    response = client.post("/api/sessions", body, content_type="application/json", headers={"Idempotency-Key": "k"})
    assert response.status_code == 413
    assert response.json() == {"code": "payload_too_large",
                               "message": f"The request body is {len(body)} bytes; the limit is {limit}.",
                               "details": {"limit": limit}}
    assert AgentSession.objects.count() == Turn.objects.count() == IdempotencyRecord.objects.count() == 0

    settings.AGENTOPS_MAX_REQUEST_BYTES = 200
    small_enough = json.dumps({"agent": agent.slug, "input": "y" * 100})
    assert client.post("/api/sessions", small_enough, content_type="application/json").status_code == 201
    too_big = json.dumps({"agent": agent.slug, "input": "y" * 200})
    assert client.post("/api/sessions", too_big, content_type="application/json").status_code == 413
    assert AgentSession.objects.count() == 1


def test_api_unknown_path_and_wrong_method_have_the_error_shape(operator: User) -> None:
    client = api_client(operator)
    unknown = client.get("/api/nothing-here")
    assert unknown.status_code == 404
    assert unknown.json() == {"code": "not_found", "message": "No such API endpoint.", "details": {}}
    wrong_method = client.put("/api/sessions", {}, content_type="application/json")
    assert wrong_method.status_code == 405
    assert wrong_method.json() == {"code": "method_not_allowed", "message": "This endpoint does not take that method.",
                                   "details": {}}
    assert set(wrong_method["Allow"].replace(" ", "").split(",")) == {"GET", "POST"}


def test_api_unexpected_error_is_500_in_the_error_shape(operator: User, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**filters: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr("sessions_app.selectors.sessions_list", broken)
    client = api_client(operator, raise_request_exception=False)
    response = client.get("/api/sessions")
    assert response.status_code == 500
    assert response.json() == {"code": "internal_error", "message": "The server failed to handle this request.",
                               "details": {}}


# --- Idempotency-Key ---------------------------------------------------------------------------------------------

def test_idempotency_same_key_and_body_replays_session_start_without_a_second_effect(operator: User,
                                                                                     agent: AgentProfile) -> None:
    client = api_client(operator)
    body = {"agent": agent.slug, "input": "deploy once"}
    first = client.post("/api/sessions", body, content_type="application/json", headers={"Idempotency-Key": "k-1"})
    events = Event.objects.count()
    second = client.post("/api/sessions", body, content_type="application/json", headers={"Idempotency-Key": "k-1"})
    assert first.status_code == second.status_code == 201
    assert second.json() == first.json() and second["Idempotent-Replayed"] == "true"
    assert AgentSession.objects.count() == Turn.objects.count() == 1
    assert Event.objects.count() == events
    assert Turn.objects.get().idempotency_key == "k-1"

    third = client.post("/api/sessions", body, content_type="application/json", headers={"Idempotency-Key": "k-2"})
    assert third.status_code == 201 and third.json()["id"] != first.json()["id"]
    assert AgentSession.objects.count() == 2


def test_idempotency_same_key_other_body_is_422(operator: User, agent: AgentProfile) -> None:
    client = api_client(operator)
    headers = {"Idempotency-Key": "k-1"}
    assert client.post("/api/sessions", {"agent": agent.slug, "input": "a"}, content_type="application/json",
                       headers=headers).status_code == 201
    response = client.post("/api/sessions", {"agent": agent.slug, "input": "b"}, content_type="application/json",
                           headers=headers)
    assert response.status_code == 422
    assert response.json()["code"] == "idempotency_key_reused"
    assert AgentSession.objects.count() == 1 and Turn.objects.get().input == "a"


def test_idempotency_key_is_scoped_to_the_caller(operator: User, agent: AgentProfile) -> None:
    other = factories.user("op2", groups=["operators"])
    body = {"agent": agent.slug, "input": "same"}
    for user in (operator, other):
        response = api_client(user).post("/api/sessions", body, content_type="application/json",
                                      headers={"Idempotency-Key": "shared"})
        assert response.status_code == 201 and response.json()["owner"] == user.username
    assert AgentSession.objects.count() == 2


def test_idempotency_without_a_key_each_post_acts(operator: User, agent: AgentProfile) -> None:
    client = api_client(operator)
    for _ in range(2):
        assert client.post("/api/sessions", {"agent": agent.slug}, content_type="application/json").status_code == 201
    assert AgentSession.objects.count() == 2 and IdempotencyRecord.objects.count() == 0
    too_long = client.post("/api/sessions", {"agent": agent.slug}, content_type="application/json",
                           headers={"Idempotency-Key": "k" * 201})
    assert too_long.status_code == 422 and too_long.json()["code"] == "invalid_idempotency_key"
    assert AgentSession.objects.count() == 2


@pytest.mark.parametrize("name", POSTS)
def test_idempotency_key_is_honoured_on_every_post(world: World, name: str) -> None:
    path, body = world.post_requests()[name]
    client = api_client(world.caller(name))
    headers = {"Idempotency-Key": f"key-{name}"}
    first = client.post(path, body, content_type="application/json", headers=headers)
    assert first.status_code in (200, 201), first.content
    after_first = _snapshot()
    second = client.post(path, body, content_type="application/json", headers=headers)
    assert (second.status_code, second.json()) == (first.status_code, first.json())
    assert second["Idempotent-Replayed"] == "true"
    assert _snapshot() == after_first  # no second effect

    other_body = {**body, "extra": 1}
    reused = client.post(path, other_body, content_type="application/json", headers=headers)
    assert reused.status_code == 422 and reused.json()["code"] == "idempotency_key_reused"
    assert _snapshot() == after_first


def _unused_token_client(user: User) -> Client:
    """A client with a brand-new token (never used: last_used_at unset)."""
    return Client(headers={"Authorization": f"Bearer {api_token(user)}"})


def test_api_auth_token_last_used_is_written_at_most_once_a_minute(operator: User) -> None:
    client = _unused_token_client(operator)
    assert ApiToken.objects.get(user=operator).last_used_at is None
    assert client.get("/api/agents").status_code == 200
    token = ApiToken.objects.get(user=operator)
    first = token.last_used_at
    assert first is not None
    assert client.get("/api/agents").status_code == 200
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first  # no write a moment later
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=2))
    assert client.get("/api/agents").status_code == 200
    written = ApiToken.objects.get(pk=token.pk).last_used_at
    assert written is not None and written > first - timedelta(seconds=1)
@pytest.mark.parametrize("authorization", [None, "Bearer aop_not-a-real-token", "Basic b3A6cHc="])
def test_idempotency_unauthenticated_post_touches_no_idempotency_row(world: World, authorization: str | None) -> None:
    client = Client(headers={"Authorization": authorization} if authorization else {})
    path, body = world.post_requests()["session_start"]
    with CaptureQueriesContext(connection) as queries:
        response = client.post(path, body, content_type="application/json", headers={"Idempotency-Key": "anon"})
    assert response.status_code == 401
    assert not [q["sql"] for q in queries.captured_queries if IdempotencyRecord._meta.db_table in q["sql"]]
    assert IdempotencyRecord.objects.count() == 0


def _post_in_thread(token: str, path: str, body: dict[str, Any], key: str) -> tuple[threading.Thread, list[Any]]:
    """POST from another thread (its own database connection); the response lands in the list."""
    out: list[Any] = []

    def post() -> None:
        try:
            out.append(Client(headers={"Authorization": f"Bearer {token}"}).post(
                path, body, content_type="application/json", headers={"Idempotency-Key": key}))
        finally:
            connection.close()

    thread = threading.Thread(target=post)
    thread.start()
    return thread, out


@pytest.mark.django_db(transaction=True)
def test_idempotency_concurrent_duplicate_gets_409_or_waits_and_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    operator = factories.user("op-race", groups=["operators"])
    agent = factories.agent_profile()
    token = api_token(operator)
    body = {"agent": agent.slug, "input": "deploy once"}
    running, release = threading.Event(), threading.Event()
    real_start = commands.session_start

    def held_start(**kwargs: Any) -> Any:
        running.set()
        assert release.wait(20), "the test never released the first request"
        return real_start(**kwargs)

    monkeypatch.setattr(commands, "session_start", held_start)
    first, first_out = _post_in_thread(token, "/api/sessions", body, "race-1")
    try:
        assert running.wait(20)  # the first request reserved the key and runs its view
        # No transaction of the middleware wraps the view: the reservation is committed and visible.
        record = IdempotencyRecord.objects.get(key="race-1")
        assert record.status_code is None

        monkeypatch.setattr(idempotency, "IN_PROGRESS_WAIT_SECONDS", 0.3)
        busy = Client(headers={"Authorization": f"Bearer {token}"}).post(
            "/api/sessions", body, content_type="application/json", headers={"Idempotency-Key": "race-1"})
        assert busy.status_code == 409
        assert busy.json() == {"code": "idempotency_in_progress",
                               "message": "A request with this Idempotency-Key is still running; retry shortly.",
                               "details": {}}

        monkeypatch.setattr(idempotency, "IN_PROGRESS_WAIT_SECONDS", 20)
        waiting = threading.Event()
        real_wait = idempotency._wait

        def noticed_wait(seconds: float) -> None:
            waiting.set()
            real_wait(seconds)

        monkeypatch.setattr(idempotency, "_wait", noticed_wait)
        second, second_out = _post_in_thread(token, "/api/sessions", body, "race-1")
        assert waiting.wait(20)  # the duplicate found the reservation and waits for it
        assert AgentSession.objects.count() == 0
    finally:
        release.set()
    first.join(30)
    second.join(30)
    assert first_out[0].status_code == 201, first_out[0].content
    assert second_out[0].status_code == 201 and second_out[0]["Idempotent-Replayed"] == "true"
    assert second_out[0].json() == first_out[0].json()
    assert AgentSession.objects.count() == Turn.objects.count() == 1
    assert IdempotencyRecord.objects.get(key="race-1").status_code == 201
