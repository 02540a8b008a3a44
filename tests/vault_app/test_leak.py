"""The leak test: a full run through a real worker, bubblewrap and PostgreSQL that uses a secret in an
``http_request`` header and in a ``run_command`` environment variable, with a command that prints it
(plain, base64, hex) and writes it into a published file, and a status API that echoes it back; and
in an MCP server's env (stdio, in the sandbox) and an MCP server's header (streamable HTTP), both
servers echoing it in their results. Then every row of every table (all columns, text-cast), every
API response and page the run produced, the captured logs, the model's request log and the stored
artifacts are scanned for the value and its base64 / hex forms: 0 hits. Also: a call naming a secret
its tool may not use, an unknown or an expired one is refused before anything runs."""

import base64
import http.server
import json
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.storage import storages
from django.db import connection
from django.test import Client
from django.utils import timezone

from approvals_app.models import ApprovalRequest
from mcp_app.models import McpServer
from mcp_app.pool import call_pool
from mcp_app.services import mcp_server_refresh
from sessions_app.engine.commands import session_start
from sessions_app.models import AgentProfile, Artifact, Step
from tests import factories
from tests.helpers import api_client, finished, pending_approvals, script, tool
from tests.mcp_app.conftest import FIXTURE, HERE, fixture_dirs, http_server_process  # noqa: F401 - fixtures
from tests.waiting import wait_for
from tools_app.models import ApprovalMode, ToolDefinition
from tools_app.selectors import tool_definitions_cache_clear
from vault_app.models import Secret
from vault_app.services import secret_create

pytestmark = pytest.mark.usefixtures("workers")

VALUE = "vlt-3c9e1f07b2a84d65"


def forms_of(value: str) -> dict[str, str]:
    """The value and the encodings of it a scan looks for (computed here, not by the redactor)."""
    raw = value.encode()
    return {"plain": value, "base64": base64.b64encode(raw).decode(),
            "base64url": base64.urlsafe_b64encode(raw).decode().rstrip("="),
            "base64(value+newline)": base64.b64encode(raw + b"\n").decode()[:24],
            "hex": raw.hex(), "HEX": raw.hex().upper()}


def _labels_in_table(cursor: Any, quoted: str, forms: dict[str, str]) -> list[str]:
    """The forms found in any row of the table, every column read as text: PostgreSQL casts the
    whole row (``r::text``, bytea as hex); elsewhere (SQLite) each value is read and cast here."""
    if connection.vendor == "postgresql":
        found = []
        for label, form in forms.items():
            cursor.execute(f"SELECT count(*) FROM {quoted} AS r WHERE strpos(r::text, %s) > 0", [form])  # noqa: S608
            if cursor.fetchone()[0]:
                found.append(label)
        return found
    cursor.execute(f"SELECT * FROM {quoted}")  # noqa: S608 - names from the catalogue
    texts = [value.hex() + value.decode("latin-1") if isinstance(value, bytes) else str(value)
             for row in cursor.fetchall() for value in row]
    return [label for label, form in forms.items() if any(form in text for text in texts)]


@pytest.fixture
def status_api() -> Iterator[tuple[int, list[str]]]:
    """A status API that wants ``Authorization: Bearer <VALUE>`` and, careless, echoes it back."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            auth = self.headers.get("Authorization", "")
            seen.append(auth)
            token = auth.removeprefix("Bearer ")
            ok = token == VALUE
            body = json.dumps({"status": "degraded" if ok else "unauthorized", "echo": auth,
                               "b64": base64.b64encode(token.encode()).decode(), "hex": token.encode().hex()}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], seen
    server.shutdown()


@pytest.fixture
def vault_world(settings, engine_agent: AgentProfile) -> tuple[User, User, User]:  # type: ignore[no-untyped-def]
    settings.AGENTOPS_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.AGENTOPS_HTTP_ALLOW_PRIVATE = True
    admin = factories.user("vadmin", is_superuser=True, is_staff=True, teams=[])
    operator = factories.user("oscar", groups=["operators"])
    reviewer = factories.user("rita", groups=["reviewers"])
    ToolDefinition.objects.filter(name="run_command").update(env={"STATUS_TOKEN": "{{secret:status_token}}"})
    tool_definitions_cache_clear()
    team_id = engine_agent.team_id
    secret_create(actor=admin, team_id=team_id, name="status_token", value=VALUE,
                  allowed_tools=["http_request", "run_command", "mcp:fx", "mcp:fxh"])
    secret_create(actor=admin, team_id=team_id, name="cmd_only", value="cmd-only-0123456789",
                  allowed_tools=["run_command"])
    secret_create(actor=admin, team_id=team_id, name="old_token", value="old-token-0123456789",
                  allowed_tools=["http_request"], expires_at=timezone.now() - timedelta(minutes=1))
    return admin, operator, reviewer


def _approve(reviewer: User, approval: ApprovalRequest) -> None:
    client = Client()
    client.force_login(reviewer)
    page = client.get(f"/approvals/{approval.request_id}/")
    assert page.status_code == 200
    response = client.post(f"/api/approvals/{approval.request_id}/decision",
                           json.dumps({"decision": "approve", "arguments_sha256": approval.arguments_sha256}),
                           content_type="application/json")
    assert response.status_code == 200, response.content


COMMAND = ('echo "token=$STATUS_TOKEN"; printf %s "$STATUS_TOKEN" | base64; echo "$STATUS_TOKEN" | base64; '
           'printf %s "$STATUS_TOKEN" | od -An -tx1 | tr -d " \\n"; echo; '
           'mkdir -p outputs && echo "leaked: $STATUS_TOKEN" > outputs/leak.txt')


@pytest.fixture
def mcp_servers(engine_agent: AgentProfile, fixture_dirs: Any, http_server_process: str) -> Iterator[None]:  # noqa: F811
    """The MCP fixture server over stdio with the secret in its env, and over streamable HTTP
    with it in an Authorization header; their read-only ``whoami`` echoes both back."""
    stdio = McpServer.objects.create(
        team_id=engine_agent.team_id, name="fx", transport=McpServer.Transport.STDIO,
        command=["python3", str(FIXTURE)], mounts=[str(HERE), str(fixture_dirs.flags)],
        env={"MCP_FIXTURE_FLAGS": str(fixture_dirs.flags), "FIXTURE_TOKEN": "{{secret:status_token}}"},
        timeout_seconds=30)
    http = McpServer.objects.create(team_id=engine_agent.team_id, name="fxh", transport=McpServer.Transport.HTTP,
                                    url=http_server_process, timeout_seconds=10,
                                    headers={"Authorization": "Bearer {{secret:status_token}}"})
    for server in (stdio, http):
        assert mcp_server_refresh(server_id=server.id).error == ""
    ToolDefinition.objects.filter(name__in=["fx__whoami", "fxh__whoami"]).update(
        approval_mode=ApprovalMode.SAFE_READONLY)
    engine_agent.tools.add(*ToolDefinition.objects.filter(name__in=["fx__whoami", "fxh__whoami"]))
    tool_definitions_cache_clear()
    yield
    call_pool().stop_all()


def test_secret_run_leaves_no_trace_anywhere(vault_world: tuple[User, User, User], engine_agent: AgentProfile,
                                             status_api: tuple[int, list[str]], scripted_model: Any,
                                             mcp_servers: None, caplog: pytest.LogCaptureFixture,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.INFO)
    admin, operator, reviewer = vault_world
    port, seen = status_api
    url = f"http://127.0.0.1:{port}/status"
    session, turn = session_start(agent=engine_agent, owner=operator, input=script(
        tool("http_request", url=url, headers={"Authorization": "Bearer {{secret:status_token}}"}),
        tool("run_command", command=COMMAND),
        tool("read_file", path="outputs/leak.txt"),
        tool("fx__whoami"), tool("fxh__whoami"),
        "All checked."))
    assert turn is not None
    (http_approval,) = pending_approvals(turn)
    # The reviewer's page names the secret the call uses (not its value); the hash binds the reference.
    reviewer_client = Client()
    reviewer_client.force_login(reviewer)
    html = reviewer_client.get(f"/approvals/{http_approval.request_id}/").content.decode()
    assert 'id="call-secrets"' in html and "status_token" in html and "resolved at run time" in html
    assert http_approval.arguments["headers"]["Authorization"] == "Bearer {{secret:status_token}}"
    _approve(reviewer, http_approval)
    (cmd_approval,) = pending_approvals(turn, 1)
    assert cmd_approval.tool_name == "run_command"
    assert cmd_approval.run_spec["env"] == {"STATUS_TOKEN": "{{secret:status_token}}"}  # bound by the hash
    cmd_html = reviewer_client.get(f"/approvals/{cmd_approval.request_id}/").content.decode()
    assert "status_token" in cmd_html and "command environment" in cmd_html
    _approve(reviewer, cmd_approval)
    done = finished(turn, timeout=60)
    assert done.status == "completed", (done.error_code, done.error_message)

    # It really ran with the value: the API got it, the command saw it; what was stored is redacted.
    assert seen == [f"Bearer {VALUE}"]
    results: dict[str, dict[str, Any]] = {s.tool_name: s.result or {}
                                          for s in Step.objects.filter(turn=turn, kind="tool")}
    assert results["http_request"]["status"] == "completed"
    assert '"echo": "Bearer [secret:status_token]"' in results["http_request"]["output"]
    out = results["run_command"]["output"]
    assert "token=[secret:status_token]" in out and out.count("[secret:status_token]") >= 4, out
    assert "leaked: [secret:status_token]" in results["read_file"]["output"]
    # The MCP servers got the value (env, header) and echoed it: stored redacted.
    assert results["fx__whoami"]["data"]["structured"]["token"] == "[secret:status_token]", results["fx__whoami"]
    assert results["fxh__whoami"]["data"]["structured"]["auth"] == "Bearer [secret:status_token]", \
        results["fxh__whoami"]
    artifact = Artifact.objects.get(session=session, path="outputs/leak.txt")
    with storages["artifacts"].open(artifact.storage_path) as stored:
        assert stored.read() == b"leaked: [secret:status_token]\n"

    # --- the scan -------------------------------------------------------------------------------
    forms = forms_of(VALUE)
    hits: list[str] = []

    def scan(where: str, text: str) -> None:
        for label, form in forms.items():
            if form in text:
                hits.append(f"{where}: {label}")

    tables = [t for t in connection.introspection.table_names() if not t.startswith("pg_")]
    rows = 0
    with connection.cursor() as cursor:
        for table in tables:
            quoted = connection.ops.quote_name(table)
            cursor.execute(f"SELECT count(*) FROM {quoted}")  # noqa: S608 - names from the catalogue
            rows += cursor.fetchone()[0]
            hits.extend(f"table {table}: {label}" for label in _labels_in_table(cursor, quoted, forms))
    op_api, rev_api, adm_api = api_client(operator), api_client(reviewer), api_client(admin)
    op_page = Client()
    op_page.force_login(operator)
    sid, tid = session.id, turn.id
    approvals = [str(a.request_id) for a in ApprovalRequest.objects.filter(session=session)]
    api_urls = [f"/api/sessions/{sid}", f"/api/sessions/{sid}/turns", f"/api/turns/{tid}",
                f"/api/sessions/{sid}/events?limit=500", f"/api/sessions/{sid}/artifacts",
                f"/api/artifacts/{artifact.id}/content", f"/api/sessions/{sid}/grants", "/api/approvals",
                f"/openai/v1/agents/sessions/{sid}", f"/openai/v1/agents/sessions/{sid}/turns",
                f"/openai/v1/agents/sessions/{sid}/artifacts",
                *[f"/api/approvals/{rid}" for rid in approvals]]
    responses = 0
    for client in (op_api, rev_api):
        for api_url in api_urls:
            response = client.get(api_url)
            assert response.status_code == 200, (api_url, response.status_code)
            scan(f"api {api_url}", b"".join(response.streaming_content).decode()
                 if hasattr(response, "streaming_content") else response.content.decode())
            responses += 1
    for api_url in ("/api/secrets", *[f"/api/secrets/{s['id']}" for s in adm_api.get("/api/secrets").json()["items"]]):
        response = adm_api.get(api_url)
        assert response.status_code == 200
        scan(f"api {api_url}", response.content.decode())
        responses += 1
    pages = [f"/sessions/{sid}/", f"/sessions/{sid}/timeline/", "/approvals/", "/sessions/", "/",
             f"/sessions/{sid}/artifacts/{artifact.id}/"]
    for page_url in pages:
        response = op_page.get(page_url)
        assert response.status_code == 200, page_url
        scan(f"page {page_url}", b"".join(response.streaming_content).decode()
             if hasattr(response, "streaming_content") else response.content.decode())
    for rid in approvals:
        response = reviewer_client.get(f"/approvals/{rid}/")
        scan(f"page /approvals/{rid}/", response.content.decode())
        pages.append(f"/approvals/{rid}/")
    admin_page = Client()
    admin_page.force_login(admin)
    for admin_url in ("/admin/vault_app/secret/",
                      *[f"/admin/vault_app/secret/{pk}/change/" for pk in Secret.objects.values_list("pk", flat=True)]):
        response = admin_page.get(admin_url)
        assert response.status_code == 200, admin_url
        scan(f"admin {admin_url}", response.content.decode())
        pages.append(admin_url)
    model_requests = scripted_model.request_log.entries()
    scan("model request log", json.dumps([e.as_json() for e in model_requests]))
    storage = storages["artifacts"]
    artifact_files = [f"{sid}/{name}" for name in storage.listdir(str(sid))[1]]
    assert artifact_files
    for name in artifact_files:
        with storage.open(name) as stored_file:
            scan(f"artifact {name}", stored_file.read().decode("latin-1"))
    captured = capfd.readouterr()
    log_text = caplog.text + captured.out + captured.err
    scan("logs", log_text)
    summary = (f"leak scan: {len(tables)} tables / {rows} rows (every column, text-cast), {responses} API responses, "
               f"{len(pages)} pages, {len(model_requests)} model requests, {len(artifact_files)} artifact files, "
               f"{len(log_text.splitlines())} log lines; forms {sorted(forms)}: {len(hits)} hits")
    with capfd.disabled():
        print("\n" + summary)
    assert hits == [], hits


def test_secret_not_allowed_unknown_or_expired_is_refused_and_nothing_runs(
        vault_world: tuple[User, User, User], engine_agent: AgentProfile,
        status_api: tuple[int, list[str]]) -> None:
    _admin, operator, _reviewer = vault_world
    port, seen = status_api
    url = f"http://127.0.0.1:{port}/status"
    session, turn = session_start(agent=engine_agent, owner=operator, input=script(
        tool("http_request", url=url, headers={"Authorization": "Bearer {{secret:cmd_only}}"}),
        tool("http_request", url=url, headers={"Authorization": "Bearer {{secret:no_such}}"}),
        tool("http_request", url=url + "?t={{secret:old_token}}"),
        # allowed for run_command, but only through its environment: never on a command line
        tool("run_command", command="echo {{secret:status_token}} > outputs/x.txt"),
        "Could not reach it."))
    assert turn is not None
    done = finished(turn, timeout=60)
    assert done.status == "completed"
    codes = list(Step.objects.filter(turn=turn, kind="tool").order_by("index").values_list("error_code", flat=True))
    assert codes == ["secret_not_allowed", "secret_unknown", "secret_expired", "secret_not_allowed_here"]
    messages = [s.error_message for s in Step.objects.filter(turn=turn, kind="tool").order_by("index")]
    assert "not allowed to use the secret 'cmd_only'" in messages[0] and "did not run" in messages[0]
    assert not ApprovalRequest.objects.filter(session=session).exists()  # nobody was asked: nothing to approve
    assert seen == []  # nothing reached the API
    assert not Artifact.objects.filter(session=session).exists()  # and no command ran


def test_secret_in_the_url_host_is_refused_before_a_reviewer_is_asked(
        vault_world: tuple[User, User, User], engine_agent: AgentProfile) -> None:
    """A reference in an http_request URL's host or port would become the host: resolved in DNS,
    sent in the clear (SNI, Host) and quoted lower-cased in errors. Refused like a reference in a
    field that may hold none; one in the path or query still goes to the reviewer."""
    _admin, operator, _reviewer = vault_world
    session, turn = session_start(agent=engine_agent, owner=operator, input=script(
        tool("http_request", url="http://{{secret:status_token}}.invalid/c"),
        tool("http_request", url="http://127.0.0.1:{{secret:status_token}}/status"),
        tool("http_request", url="http://127.0.0.1:9/status?token={{secret:status_token}}"),
        "Asked."))
    assert turn is not None

    def asking() -> list[Step] | None:  # the turn stops at the first call that goes to a reviewer
        if not ApprovalRequest.objects.filter(session=session, status="pending").exists():
            return None
        return list(Step.objects.filter(turn=turn, kind="tool").order_by("index"))

    steps = wait_for(asking, 60, "a call to go to a reviewer")
    print("\n", [(s.error_code, s.error_message) for s in steps])
    assert [s.error_code for s in steps] == ["secret_not_allowed_here"] * 2 + [""]
    assert steps[0].error_message == steps[1].error_message == (
        "http_request may reference secrets in the URL's path or query and in headers, not in its scheme or host "
        "({{secret:status_token}}): a host is looked up in DNS, sent in the clear and shown in errors. The call "
        "did not run.")
    (pending,) = ApprovalRequest.objects.filter(session=session, status="pending")
    assert pending.arguments["url"].endswith("?token={{secret:status_token}}")
