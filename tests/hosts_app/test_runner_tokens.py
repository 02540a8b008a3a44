"""Runner tokens and job-signing keys: the key that signs a runner's jobs is derived from the
server's secret (not the token, not the database); the runner pins its public key from its token;
a runner from before signed jobs is refused until it gets a new token."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agentops.runner.protocol import split_token, token_hash, verify_job
from hosts_app import runners
from hosts_app.models import SandboxHost, SessionPlacement
from hosts_app.runner_keys import RunnerKeyUnavailable
from sessions_app.models import Step
from tests import factories
from tests.helpers import ROOT, api_client
from tools_app.services import tool_definitions_seed


@pytest.fixture
def operator() -> User:
    return factories.user("op", groups=["operators"])


def approved_step(operator: User, runner: SandboxHost) -> Step:
    tool_definitions_seed()
    session = factories.session(owner=operator)
    SessionPlacement.objects.create(session=session, host=runner)
    return factories.step(factories.turn(session), tool_name="run_command", status="approved",
                          approval_mode="safe_readonly", arguments={"command": "true"})


@pytest.mark.django_db
def test_runner_jobs_are_signed_with_a_key_of_the_server_secret_not_of_the_database(
        operator: User, settings: Any) -> None:
    runner, token = runners.runner_create(team=factories.team(), name="cust", actor=operator)
    secret, pinned = split_token(token)
    row = SandboxHost.objects.filter(pk=runner.pk).values().get()
    assert row["token_hash"] == token_hash(secret) and secret not in str(row)
    assert "signing_key" not in row  # nothing in the row signs
    step = approved_step(operator, runner)
    # Another server secret, same database: it cannot sign for this runner, and claims nothing.
    original = settings.SECRET_KEY
    settings.SECRET_KEY = "another-server-secret-" + "x" * 40
    with pytest.raises(RunnerKeyUnavailable, match="POST /api/runners/cust/token"):
        runners.runner_next_job(host=runner)
    assert Step.objects.get(pk=step.pk).status == "approved"
    # The old secret kept as a fallback while DJANGO_SECRET_KEY rotates: the runner's key still signs.
    settings.SECRET_KEY_FALLBACKS = [original]
    envelope = runners.runner_next_job(host=runner)
    assert envelope is not None and envelope["job"]["step_id"] == str(step.id)
    verify_job(key=pinned, runner="cust", job=envelope["job"], signature=envelope["signature"])


def test_a_runner_refuses_to_start_with_a_token_that_pins_no_key(tmp_path: Path) -> None:
    """A token from before signed jobs (``aor_<secret>``, no public key): the runner stops at once
    with what to do, rather than run jobs it cannot verify (it never contacts the server)."""
    done = subprocess.run([sys.executable, "-m", "agentops.runner", "--url", "http://127.0.0.1:9", "--token",
                           "aor_" + "a" * 43, "--workdir", str(tmp_path / "runner")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "carries no job-signing public key" in done.stderr
    assert "POST /api/runners/<name>/token" in done.stderr


@pytest.mark.django_db(transaction=True)
def test_a_runner_from_before_signed_jobs_is_refused_until_it_gets_a_new_token(operator: User) -> None:
    team = factories.team()
    old_token = "aor_" + "b" * 43
    # As migration 0002 leaves a runner created before: its token's hash, no public key.
    SandboxHost.objects.create(name="legacy", kind="runner", team=team, token_hash=token_hash(old_token))
    heartbeat = "/api/runner/heartbeat"
    refused = Client(headers={"Authorization": f"Bearer {old_token}"}).post(heartbeat, {},
                                                                            content_type="application/json")
    assert refused.status_code == 401 and refused.json()["code"] == "runner_token_outdated"
    assert "POST /api/runners/legacy/token" in refused.json()["message"]

    response = api_client(operator).post("/api/runners/legacy/token", {}, content_type="application/json")
    assert response.status_code == 200, response.content
    secret, _pinned = split_token(response.json()["token"])
    assert SandboxHost.objects.get(name="legacy").public_key
    ok = Client(headers={"Authorization": f"Bearer {secret}"}).post(heartbeat, {}, content_type="application/json")
    assert ok.status_code == 200 and ok.json()["name"] == "legacy"
    again = Client(headers={"Authorization": f"Bearer {old_token}"}).post(heartbeat, {},
                                                                          content_type="application/json")
    assert again.status_code == 401 and again.json()["code"] != "runner_token_outdated"
    reviewer = factories.user("rev", groups=["reviewers"])
    assert api_client(reviewer).post("/api/runners/legacy/token", {},
                                     content_type="application/json").status_code in (403, 404)


def test_a_runner_started_before_its_server_waits_for_it(tmp_path: Path) -> None:
    """A runner whose server does not answer yet (started first, or the network down) tries again
    with a growing pause, saying so, instead of stopping with a traceback; once something answers
    it goes on (here a server refusing its token: exit 3, with why)."""
    import http.server
    import threading

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from agentops.embedded_redis import free_port
    from agentops.runner.protocol import KEY_SEPARATOR, _b64

    public = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                    serialization.PublicFormat.Raw)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentops.runner", "--url", f"http://127.0.0.1:{port}", "--token",
                             "aor_" + "a" * 43 + KEY_SEPARATOR + _b64(public), "--workdir", str(tmp_path / "runner")],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.stderr is not None
    server = None
    try:
        lines: list[str] = []
        while len([line for line in lines if "cannot reach" in line]) < 2:
            line = proc.stderr.readline()
            assert line, "".join(lines)  # the runner stopped
            lines.append(line)
        assert proc.poll() is None

        class Refuse(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.send_response(401)
                self.end_headers()
                self.wfile.write(b'{"message": "revoked"}')

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Refuse)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        assert proc.wait(timeout=30) == 3
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        if server is not None:
            server.shutdown()
    assert "Traceback" not in "".join(lines) + rest
    assert "refused this runner's token" in rest
