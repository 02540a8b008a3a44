"""The authorization matrix: every API endpoint, page and WebSocket route × every kind of caller
→ the status it must get, generated from the one declaration ``MATRIX`` below.

Callers (``PERSONAS``): anonymous; an operator and a reviewer of the objects' team ("same") and
of another team ("other"); the author of the turn that produced the pending request, who holds
both roles in the team (four-eyes: may not decide it); an admin (superuser, in no team); and a
revoked API token (pages and sockets: a client whose only credential is that token).

The HTTP cases share one world, built once in a transaction that is rolled back after them (each
case runs in a savepoint inside it, so what one case writes is gone before the next); each
WebSocket case (a transactional test) builds its own. The world: team ``same`` holding an agent,
a busy session (its turn, written by the author, waits for a reviewer on a run_command request; it
has an artifact, a grant and a waiting client tool call) and an idle session; team ``other`` with
its own members. Completeness is checked too: a new API operation, page or socket route without
a row here fails the suite.

WebSocket statuses: 101 accepted, else the close code (4401 signed out, 4403 no access).
"""

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.core.signals import request_finished
from django.db import close_old_connections, transaction
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from agentops.models import ApiToken
from approvals_app import services as approval_services
from approvals_app.models import ApprovalGrant, ApprovalRequest
from fanout_app.models import Batch, BatchMember
from hosts_app import runners
from hosts_app.models import SandboxHost
from notify_app.signing import link_token
from sessions_app import services as session_services
from sessions_app.models import AgentSession, Artifact, Step, Turn
from sessions_app.services import step_transition
from tests import factories
from tests.helpers import api_token
from tools_app.services import tool_definitions_seed
from vault_app.crypto import encrypt
from vault_app.models import Secret

PERSONAS = ("anonymous", "op_same", "op_other", "rev_same", "rev_other", "author_both", "admin", "revoked_token")


def _row(anonymous: int, op_same: int, op_other: int, rev_same: int, rev_other: int, author_both: int,
         admin: int, revoked_token: int) -> dict[str, int]:
    return dict(zip(PERSONAS, (anonymous, op_same, op_other, rev_same, rev_other, author_both, admin,
                               revoked_token), strict=True))


# Reading something of team "same": members see it, others get 404.
READ_SAME = _row(401, 200, 404, 200, 404, 200, 200, 401)
# Listing (scoped): everybody signed in gets 200 (other teams an empty or their own list).
LIST = _row(401, 200, 200, 200, 200, 200, 200, 401)
PAGE_READ_SAME = _row(302, 200, 404, 200, 404, 200, 200, 302)
PAGE_LIST = _row(302, 200, 200, 200, 200, 200, 200, 302)
RUNNER_ONLY = _row(401, 401, 401, 401, 401, 401, 401, 401)

MATRIX: list[tuple[str, str, str, dict[str, Any] | None, dict[str, int]]] = [
    # kind, method, path ({placeholders} from the world), body, expected status per persona
    ("api", "GET", "/api/sessions", None, LIST),
    ("api", "POST", "/api/sessions", {"agent": "{agent}", "input": "hi"}, _row(401, 201, 404, 403, 403, 201, 201, 401)),
    ("api", "GET", "/api/sessions/{busy}", None, READ_SAME),
    ("api", "POST", "/api/sessions/{busy}/cancel", {}, _row(401, 200, 404, 403, 403, 200, 200, 401)),
    ("api", "POST", "/api/sessions/{idle}/turns", {"input": "next"}, _row(401, 201, 404, 403, 403, 201, 201, 401)),
    ("api", "GET", "/api/sessions/{busy}/turns", None, READ_SAME),
    ("api", "GET", "/api/turns/{turn}", None, READ_SAME),
    ("api", "GET", "/api/sessions/{busy}/events", None, READ_SAME),
    ("api", "GET", "/api/sessions/{busy}/events/stream?max_seconds=0.05", None, READ_SAME),
    ("api", "POST", "/api/sessions/{client}/tool-outputs", {"call_id": "call_client", "output": "ok"},
     _row(401, 200, 404, 403, 403, 200, 200, 401)),
    ("api", "GET", "/api/sessions/{busy}/artifacts", None, READ_SAME),
    ("api", "GET", "/api/artifacts/{artifact}/content", None, READ_SAME),
    ("api", "GET", "/api/agents", None, LIST),
    ("api", "GET", "/api/tools", None, LIST),
    ("api", "GET", "/api/mcp/servers", None, LIST),
    ("api", "GET", "/api/approvals", None, LIST),
    ("api", "GET", "/api/approvals/{request}", None, READ_SAME),
    ("api", "POST", "/api/approvals/{request}/decision", {"decision": "approve", "arguments_sha256": "{sha}"},
     _row(401, 403, 404, 200, 404, 403, 200, 401)),
    ("api", "GET", "/api/sessions/{busy}/grants", None, READ_SAME),
    ("api", "POST", "/api/grants/{grant}/revoke", {}, _row(401, 403, 404, 200, 404, 200, 200, 401)),
    ("api", "POST", "/api/sessions/{busy}/budget", {"max_tool_calls": None},
     _row(401, 200, 404, 403, 403, 200, 200, 401)),
    ("api", "POST", "/api/sessions/{busy}/compact", {}, _row(401, 202, 404, 403, 403, 202, 202, 401)),
    ("api", "PUT", "/api/sessions/{idle}/pinned", {"requirements": ["keep it short"]},
     _row(401, 200, 404, 403, 403, 200, 200, 401)),
    # The turn is active: retrying it is the idempotent replay (200) for those allowed.
    ("api", "POST", "/api/turns/{turn}/retry", {}, _row(401, 200, 404, 403, 403, 200, 200, 401)),
    # The vault: metadata for the team's members; writes need the vault_app permissions (admins).
    ("api", "GET", "/api/secrets", None, LIST),
    # Another team's slug is as unknown as one that does not exist (404): a 403 told it existed.
    ("api", "POST", "/api/secrets", {"team": "same", "name": "new_one", "value": "0123456789abcdef"},
     _row(401, 403, 404, 403, 404, 403, 201, 401)),
    ("api", "GET", "/api/secrets/{secret}", None, READ_SAME),
    ("api", "PATCH", "/api/secrets/{secret}", {"description": "changed"},
     _row(401, 403, 404, 403, 404, 403, 200, 401)),
    ("api", "DELETE", "/api/secrets/{secret}", None, _row(401, 403, 404, 403, 404, 403, 204, 401)),
    ("api", "GET", "/api/sessions/{busy}/subagents", None, READ_SAME),
    ("api", "POST", "/api/sessions/batch", {"agent": "{agent}", "rows": [{"input": "hi"}]},
     _row(401, 201, 404, 403, 403, 201, 201, 401)),
    ("api", "GET", "/api/batches/{batch}", None, READ_SAME),
    ("api", "POST", "/api/batches/{batch}/cancel", {}, _row(401, 200, 404, 403, 403, 200, 200, 401)),
    # Sandbox hosts: hosted hosts are listed to everyone signed in, a runner to its team only.
    ("api", "GET", "/api/hosts", None, LIST),
    ("api", "GET", "/api/hosts/{runner}", None, READ_SAME),
    ("api", "GET", "/api/sessions/{busy}/host", None, READ_SAME),
    ("api", "POST", "/api/sessions/{idle}/host", {"host": "{host}"}, _row(401, 200, 404, 403, 404, 200, 200, 401)),
    ("api", "POST", "/api/runners", {"name": "r-new", "team": "same"}, _row(401, 201, 404, 403, 404, 201, 201, 401)),
    ("api", "POST", "/api/runners/{runner}/revoke", {}, _row(401, 200, 404, 403, 404, 200, 200, 401)),
    ("api", "POST", "/api/runners/{runner}/token", {}, _row(401, 200, 404, 403, 404, 200, 200, 401)),
    # The runners' own endpoints take a runner's token, never a user's credentials.
    ("api", "POST", "/api/runner/heartbeat", {}, RUNNER_ONLY),
    ("api", "POST", "/api/runner/jobs/next?wait=0", None, RUNNER_ONLY),
    ("api", "POST", "/api/runner/jobs/{job}/progress", {"output": "x"}, RUNNER_ONLY),
    ("api", "POST", "/api/runner/jobs/{job}/files/{sha}?offset=0&size=2", {}, RUNNER_ONLY),
    ("api", "POST", "/api/runner/jobs/{job}/result", {"result": {}}, RUNNER_ONLY),
    ("api", "POST", "/api/runner/jobs/{job}/refused", {"reason": "x"}, RUNNER_ONLY),
    ("api", "POST", "/api/runner/jobs/{job}/manifest", {"changed": True}, RUNNER_ONLY),
    ("page", "GET", "/hosts/", None, PAGE_LIST),
    ("page", "GET", "/", None, PAGE_LIST),
    ("page", "GET", "/health-panel/", None, PAGE_LIST),
    ("page", "GET", "/sessions/", None, PAGE_LIST),
    ("page", "POST", "/sessions/new/", {"agent": "{agent}", "input": "hi"},
     _row(302, 302, 422, 403, 403, 302, 302, 302)),
    ("page", "GET", "/sessions/{busy}/", None, PAGE_READ_SAME),
    ("page", "GET", "/sessions/{busy}/timeline/", None, PAGE_READ_SAME),
    ("page", "POST", "/sessions/{idle}/turns/", {"input": "next"}, _row(302, 302, 404, 403, 403, 302, 302, 302)),
    ("page", "POST", "/sessions/{busy}/cancel/", {}, _row(302, 302, 404, 403, 403, 302, 302, 302)),
    ("page", "POST", "/sessions/{busy}/budget/", {"max_tool_calls": "1000"},
     _row(302, 302, 404, 403, 403, 302, 302, 302)),
    ("page", "POST", "/sessions/{busy}/compact/", {}, _row(302, 302, 404, 403, 403, 302, 302, 302)),
    ("page", "POST", "/sessions/{idle}/pinned/", {"requirements": "keep it short"},
     _row(302, 302, 404, 403, 403, 302, 302, 302)),
    ("page", "POST", "/sessions/{busy}/turns/{turn}/retry/", {}, _row(302, 302, 404, 403, 403, 302, 302, 302)),
    ("page", "GET", "/sessions/{busy}/artifacts/{artifact}/", None, PAGE_READ_SAME),
    ("page", "GET", "/batches/", None, PAGE_LIST),
    ("page", "POST", "/batches/new/", {"agent": "{agent}", "rows": '["hi"]'},
     _row(302, 302, 422, 403, 403, 302, 302, 302)),
    ("page", "GET", "/batches/{batch}/", None, PAGE_READ_SAME),
    ("page", "POST", "/batches/{batch}/cancel/", {}, _row(302, 302, 404, 403, 403, 302, 302, 302)),
    ("page", "GET", "/sessions/{busy}/subagents/", None, PAGE_READ_SAME),
    ("page", "GET", "/approvals/", None, PAGE_LIST),
    ("page", "GET", "/approvals/{request}/", None, PAGE_READ_SAME),
    ("page", "POST", "/approvals/{request}/decide/", {"decision": "approve", "arguments_sha256": "{sha}"},
     _row(302, 403, 404, 302, 404, 403, 302, 302)),
    ("page", "POST", "/grants/{grant}/revoke/", {}, _row(302, 403, 404, 302, 404, 302, 302, 302)),
    # The reviewer's workflow (issue 17): claims, bulk approval of identical requests, email links
    # (the link in the world was sent to rev_same: anyone else signed in gets 403).
    ("page", "POST", "/approvals/{request}/claim/", {}, _row(302, 403, 404, 302, 404, 403, 302, 302)),
    ("page", "POST", "/approvals/{request}/release/", {}, _row(302, 403, 404, 302, 404, 403, 302, 302)),
    ("page", "GET", "/approvals/bulk/", None, PAGE_LIST),
    ("page", "POST", "/approvals/bulk/", {"request_id": "{request}", "arguments_sha256": "{sha}"},
     _row(302, 403, 403, 302, 404, 302, 302, 302)),  # done: back to the page (post/redirect/get)
    ("page", "GET", "/approvals/link/{link}/", None, _row(302, 403, 403, 302, 403, 403, 403, 302)),
    # The OpenAI Agents wire (/openai/v1): the same selectors; errors in the wire's envelope.
    ("wire", "GET", "/openai/v1/agents", None, LIST),
    ("wire", "GET", "/openai/v1/agents/sessions", None, LIST),
    ("wire", "GET", "/openai/v1/agents/sessions/{busy}", None, READ_SAME),
    ("wire", "GET", "/openai/v1/agents/sessions/{busy}/turns", None, READ_SAME),
    ("wire", "GET", "/openai/v1/agents/sessions/{busy}/artifacts", None, READ_SAME),
    ("wire", "GET", "/openai/v1/agents/sessions/{busy}/subagents", None, READ_SAME),
    # A vault is a team (its slug); a credential one of its secrets: writes need the vault_app permissions.
    ("wire", "GET", "/openai/v1/vaults", None, LIST),
    ("wire", "GET", "/openai/v1/vaults/same/credentials", None, READ_SAME),
    ("wire", "GET", "/openai/v1/vaults/same/credentials/{secret}", None, READ_SAME),
    ("wire", "POST", "/openai/v1/vaults/same/credentials",
     {"name": "new_one", "auth": {"type": "environment_variable", "secret_value": "0123456789abcdef"}},
     _row(401, 403, 404, 403, 404, 403, 200, 401)),
    ("wire", "DELETE", "/openai/v1/vaults/same/credentials/{secret}", None,
     _row(401, 403, 404, 403, 404, 403, 200, 401)),
    # An environment is a sandbox host; creating a self_hosted one creates a runner of the team.
    ("wire", "GET", "/openai/v1/agents/environments", None, LIST),
    ("wire", "GET", "/openai/v1/agents/environments/{runner}", None, READ_SAME),
    ("wire", "POST", "/openai/v1/agents/environments",
     {"environment": {"type": "self_hosted"}, "agentops_runner": {"name": "r-new", "team": "same"}},
     _row(401, 200, 404, 403, 404, 200, 200, 401)),
    ("ws", "CONNECT", "/ws/sessions/{busy}/", None, _row(4401, 101, 4403, 101, 4403, 101, 101, 4401)),
    ("ws", "CONNECT", "/ws/approvals/", None, _row(4401, 101, 101, 101, 101, 101, 101, 4401)),
]

# Routes outside the matrix, and why: the admin, login/logout, health and the API docs are not
# objects of a team (their own tests cover them).
UNSCOPED_PAGES = {"admin/", "login/", "logout/", "healthz", "api/"}
# The wire's routes are rows of kind "wire" above (a sample of its reads; tests/openai_api covers the rest).
WIRE_PREFIX = "openai/v1/"

CASES = [(kind, method, path, body, persona, expected[persona])
         for kind, method, path, body, expected in MATRIX for persona in PERSONAS]
CASE_IDS = [f"{method} {path} as {persona}" for _kind, method, path, _body, persona, _expected in CASES]


@dataclass
class World:
    values: dict[str, str]
    users: dict[str, User | None]
    tokens: dict[str, str]
    revoked_token: str

    def fill(self, text: str) -> str:
        for key, value in self.values.items():
            text = text.replace("{" + key + "}", value)
        return text


def build_world() -> World:
    tool_definitions_seed()
    factories.ensure_roles()
    same, other = factories.team("same"), factories.team("other")
    agent = factories.agent_profile(team=same)
    owner = factories.user(groups=["operators"], teams=["same"])
    users: dict[str, User | None] = {
        "anonymous": None,
        "op_same": factories.user(groups=["operators"], teams=["same"]),
        "op_other": factories.user(groups=["operators"], teams=["other"]),
        "rev_same": factories.user(groups=["reviewers"], teams=["same"]),
        "rev_other": factories.user(groups=["reviewers"], teams=["other"]),
        "author_both": factories.user(groups=["operators", "reviewers"], teams=["same"]),
        "admin": factories.user(groups=["admins"], teams=[], is_staff=True, is_superuser=True),
        "revoked_token": factories.user(groups=["operators", "reviewers"], teams=["same"]),
    }
    factories.agent_profile(team=other)
    busy = factories.session(agent=agent, owner=owner)
    turn = session_services.turn_create(session_id=busy.id, input="clean up", actor=users["author_both"])
    step = factories.step(turn, tool_name="run_command", call_id="call_cmd", arguments={"command": "ls"},
                          approval_mode="mutating")
    approval = approval_services.approval_request_create(step_id=step.id)
    grant = ApprovalGrant.objects.create(session=busy, tool_name="write_file", arguments_sha256="0" * 64, turn=turn)
    folder = Path(settings.AGENTOPS_ARTIFACT_ROOT) / str(busy.id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report").write_text("report\n")
    artifact = Artifact.objects.create(session=busy, turn=turn, path="outputs/r.txt", size=7, sha256="a" * 64,
                                       storage_path=str(folder / "report"), content_type="text/plain")
    idle = factories.session(agent=agent, owner=owner)
    client_session = factories.session(agent=agent, owner=owner)
    client_turn = session_services.turn_create(session_id=client_session.id, input="ask the client")
    client_step = factories.step(client_turn, tool_name="lookup_customer", call_id="call_client")
    step_transition(step_id=client_step.id, to=Step.Status.RUNNING)
    secret = Secret.objects.create(team=same, name="status_token", ciphertext=encrypt("s3cret-value-123"),
                                   allowed_tools=["http_request"])
    batch = Batch.objects.create(team=same, agent=agent, owner=owner, title="nightly", request_sha256="0" * 64, size=1)
    BatchMember.objects.create(batch=batch, session=idle, row=0)
    SandboxHost.objects.create(name="h1", kind="hosted", status="online")
    runners.runner_create(team=same, name="r1", actor=users["admin"])  # type: ignore[arg-type]
    tokens = {name: api_token(user) for name, user in users.items() if user is not None}
    ApiToken.objects.filter(user=users["revoked_token"]).update(revoked_at=timezone.now())
    return World(values={"agent": agent.slug, "busy": str(busy.id), "idle": str(idle.id), "turn": str(turn.id),
                         "client": str(client_session.id), "artifact": str(artifact.id),
                         "request": str(approval.request_id), "sha": approval.arguments_sha256,
                         "grant": str(grant.pk), "secret": str(secret.pk), "host": "h1", "runner": "r1",
                         "job": f"{step.id}:1", "batch": str(batch.id),
                         "link": link_token(request_id=approval.request_id, user_id=users["rev_same"].pk)},  # type: ignore[union-attr]
                 users=users, tokens=tokens, revoked_token=tokens["revoked_token"])


def _http_client(world: World, kind: str, persona: str) -> Client:
    if persona == "anonymous":
        return Client()
    if persona == "revoked_token":
        return Client(headers={"Authorization": f"Bearer {world.revoked_token}"})
    if kind in ("api", "wire"):
        return Client(headers={"Authorization": f"Bearer {world.tokens[persona]}"})
    client = Client()
    client.force_login(world.users[persona])  # type: ignore[arg-type]
    return client


def test_matrix_covers_every_route_and_prints_its_size() -> None:
    from agentops.api import api

    declared_api = {(method, path.split("?")[0]) for kind, method, path, _b, _e in MATRIX if kind == "api"}
    schema = api.get_openapi_schema()
    operations = {(method.upper(), "/api" + path if not path.startswith("/api") else path)
                  for path, item in schema["paths"].items() for method in item}
    normalise = {(m, p.replace("{busy}", "{session_id}").replace("{idle}", "{session_id}")
                  .replace("{client}", "{session_id}").replace("{turn}", "{turn_id}")
                  .replace("{artifact}", "{artifact_id}").replace("{request}", "{request_id}")
                  .replace("{grant}", "{grant_id}").replace("{secret}", "{secret_id}")
                  .replace("{runner}", "{name}").replace("{job}", "{job_id}").replace("{batch}", "{batch_id}")
                  .replace("{sha}", "{sha256}"))
                 for m, p in declared_api}
    assert operations == normalise, operations ^ normalise

    patterns = get_resolver().url_patterns
    pages = {str(p.pattern) for p in patterns if isinstance(p, URLResolver | URLPattern)} - UNSCOPED_PAGES
    assert WIRE_PREFIX in pages and any(kind == "wire" for kind, *_ in MATRIX)
    pages.discard(WIRE_PREFIX)
    declared_pages = {path.lstrip("/").replace("{busy}", "<uuid:session_id>").replace("{idle}", "<uuid:session_id>")
                      .replace("{artifact}", "<uuid:artifact_id>").replace("{request}", "<uuid:request_id>")
                      .replace("{grant}", "<int:grant_id>").replace("{turn}", "<uuid:turn_id>")
                      .replace("{link}", "<str:token>")
                      .replace("{batch}", "<uuid:batch_id>")
                      for kind, _m, path, _b, _e in MATRIX if kind == "page"}
    assert pages == declared_pages, pages ^ declared_pages
    from agentops.routing import websocket_urlpatterns

    sockets = {str(p.pattern) for p in websocket_urlpatterns}
    declared_sockets = {path.lstrip("/").replace("{busy}", "<uuid:session_id>")
                        for kind, _m, path, _b, _e in MATRIX if kind == "ws"}
    assert sockets == declared_sockets
    print(f"\nauthorization matrix: {len(MATRIX)} routes x {len(PERSONAS)} callers = {len(CASES)} cases")
    assert len(CASES) == len(MATRIX) * len(PERSONAS)


HTTP_CASES = [(c, i) for c, i in zip(CASES, CASE_IDS, strict=True) if c[0] != "ws"]
WS_CASES = [(c, i) for c, i in zip(CASES, CASE_IDS, strict=True) if c[0] == "ws"]


@pytest.fixture(scope="class")
def http_world(django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[tuple[World, Path]]:
    """The world of every HTTP case and its artifact root, in a transaction rolled back after the
    class: a case's own ``django_db`` transaction nests inside it as a savepoint."""
    artifacts = tmp_path_factory.mktemp("matrix-artifacts")
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
                           AGENTOPS_ARTIFACT_ROOT=artifacts):
        with django_db_blocker.unblock():
            outer = transaction.atomic()
            outer.__enter__()
            world = build_world()
        try:
            yield world, artifacts
        finally:
            with django_db_blocker.unblock():
                transaction.set_rollback(True)
                outer.__exit__(None, None, None)


@pytest.mark.django_db
class TestHttpAuthorization:
    @pytest.mark.parametrize(("kind", "method", "path", "body", "persona", "expected"), [c for c, _ in HTTP_CASES],
                             ids=[i for _, i in HTTP_CASES])
    def test_http_authorization(self, http_world: tuple[World, Path], settings: Any, kind: str, method: str,
                                path: str, body: dict[str, Any] | None, persona: str, expected: int) -> None:
        world, settings.AGENTOPS_ARTIFACT_ROOT = http_world
        client = _http_client(world, kind, persona)
        url = world.fill(path)
        data = {k: world.fill(v) if isinstance(v, str) else v for k, v in (body or {}).items()}
        if method == "GET":
            response = client.get(url)
        elif method in ("PUT", "PATCH"):
            response = client.generic(method, url, json.dumps(data), content_type="application/json")
        elif method == "DELETE":
            response = client.delete(url)
        elif kind in ("api", "wire"):
            response = client.post(url, json.dumps(data), content_type="application/json")
        else:
            response = client.post(url, data)
        if hasattr(response, "streaming_content") and response.status_code == 200:
            # Closed as the test client closes a plain response: without close_old_connections,
            # which would close the connection and with it the world's open transaction.
            request_finished.disconnect(close_old_connections)
            try:
                response.close()
            finally:
                request_finished.connect(close_old_connections)
        assert response.status_code == expected, getattr(response, "content", b"")[:300]
        if expected in (401, 403, 404) and kind == "api":
            assert set(response.json()) == {"code", "message", "details"}
        if expected in (401, 403, 404, 302) and method != "GET" and not (kind == "page" and expected == 302
                                                                           and persona not in ("anonymous",
                                                                                               "revoked_token")):
            _assert_nothing_changed(world)


def _assert_nothing_changed(world: World) -> None:
    """A refused write changed nothing."""
    assert AgentSession.objects.count() == 3
    assert Turn.objects.filter(session_id=uuid.UUID(world.values["idle"])).count() == 0
    approval = ApprovalRequest.objects.get(request_id=world.values["request"])
    assert approval.status == "pending" and approval.claimed_by_id is None
    assert ApprovalGrant.objects.get(pk=world.values["grant"]).revoked_at is None
    assert Step.objects.get(call_id="call_client").status == "running"
    assert Turn.objects.get(pk=world.values["turn"]).status != "cancelled"
    assert list(Secret.objects.values_list("name", "description")) == [("status_token", "")]
    assert not SandboxHost.objects.filter(name="r-new").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_connections")
@pytest.mark.parametrize(("kind", "method", "path", "body", "persona", "expected"), [c for c, _ in WS_CASES],
                         ids=[i for _, i in WS_CASES])
async def test_websocket_authorization(kind: str, method: str, path: str, body: Any, persona: str,
                                       expected: int) -> None:
    from agentops.asgi import application

    world = await database_sync_to_async(build_world)()
    headers = [(b"origin", b"http://testserver")]
    user = world.users[persona]
    if user is not None and persona != "revoked_token":
        client = Client()
        await database_sync_to_async(client.force_login)(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    comm = WebsocketCommunicator(application, world.fill(path), headers=headers)
    connected, code = await comm.connect()
    assert (101 if connected else code) == expected
    await comm.disconnect()


def test_case_ids_are_unique() -> None:
    assert len(set(CASE_IDS)) == len(CASE_IDS)
