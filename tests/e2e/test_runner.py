"""A customer runner (``python -m agentops.runner``, a separate process with no database or broker
settings) talking HTTP to a real daphne: it runs its team's approved commands in its own sandbox,
a result re-sent after a reconnect is recorded once, a tampered job is refused, a revoked runner is
refused at once. Mid-command failures: its connection cut while the command runs (the server
records the result, the runner never hears back and sends it again) → one result; the runner
SIGKILLed mid-command and started again → the sweeper asks it for the workspace manifest and, the
workspace having changed, a reviewer decides."""

import contextlib
import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings

from agentops.runner.__main__ import Runner
from agentops.runner.protocol import JobRefused, sign, spec_sha256, split_token, verify_job
from approvals_app.models import ApprovalRequest
from hosts_app.models import RunnerResult, SandboxHost, SessionPlacement
from hosts_app.runner_keys import runner_signing_key
from sessions_app.engine.commands import turn_submit
from sessions_app.engine.recovery import sweep
from sessions_app.models import Artifact, Event, Step
from tests.e2e.conftest import SCREENSHOTS, Stack, World, login
from tests.e2e.runner_kit import RunnerProcs, approve, approved_command, online
from tests.helpers import api_client, finished, pending_approvals, script, tool
from tests.waiting import wait_for
from tools_app.models import ToolDefinition

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def stack_env() -> dict[str, str]:
    return {"AGENTOPS_LEASE_SECONDS": "2"}  # a lease is the tool's timeout plus this


class CuttableProxy:
    """A loopback TCP proxy in front of daphne. While ``cut`` is set, every request still reaches
    the server but the first byte of its answer closes the runner's connection: the runner sees
    the connection drop and never learns what the server did."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(65536):
                if answers and self.cut.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):  # shutdown, not just close: it wakes the other direction's recv
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.closed = True
        self.listener.close()


@pytest.fixture
def proxy(stack: Stack) -> Iterator[CuttableProxy]:
    p = CuttableProxy(stack.web_port)
    yield p
    p.close()


def test_runner_runs_approved_commands_and_a_resent_result_is_recorded_once(
        world: World, stack: Stack, runner_setup: tuple[RunnerProcs, str]) -> None:
    procs, token = runner_setup
    marker = procs.workdir.parent / f"{procs.workdir.name}-held"
    procs.start(AGENTOPS_RUNNER_FAILPOINT_BEFORE_RESULT=str(marker))
    wait_for(lambda: online("cust-1"), 60, "the runner online")
    session, turn = approved_command(world, "mkdir -p outputs && echo on-runner | tee outputs/r.txt")
    # The runner ran it, kept its result, and loses its connection before sending it.
    wait_for(lambda: marker.exists() or None, 60, "the runner to hold its result")
    procs.kill_all()
    step = Step.objects.get(turn=turn, kind="tool")
    assert Step.objects.get(pk=step.pk).status == "running"
    # It reconnects (a new process, the same work directory): the kept result is delivered.
    procs.start()
    turn = finished(turn, timeout=60)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    step.refresh_from_db()
    assert step.status == "completed" and "on-runner" in (step.result or {})["output"]
    assert SessionPlacement.objects.get(session=session).host.name == "cust-1"
    assert (procs.workdir / "workspaces" / str(session.id) / "outputs" / "r.txt").read_text() == "on-runner\n"
    assert not (Path(settings.AGENTOPS_WORKSPACE_ROOT) / str(session.id)).exists()  # never on the server
    (artifact,) = Artifact.objects.filter(session=session)
    assert (Path(settings.AGENTOPS_ARTIFACT_ROOT) / artifact.storage_path).read_bytes() == b"on-runner\n"

    # The same result sent again: acknowledged, recorded once.
    job_id = RunnerResult.objects.get(step=step).job_id
    again = httpx.post(f"{stack.url}/api/runner/jobs/{job_id}/result",
                       headers={"Authorization": f"Bearer {split_token(token)[0]}"},
                       json={"result": {"status": "completed", "output": "a second copy"}, "files": []})
    assert again.status_code == 200 and again.json() == {"recorded": False}
    assert RunnerResult.objects.get(step=step).deliveries == 2
    assert Event.objects.filter(step=step, type="tool.completed").count() == 1
    step.refresh_from_db()
    assert "a second copy" not in (step.result or {})["output"]


def test_runner_refuses_a_tampered_job_and_a_revoked_runner_is_refused(
        world: World, stack: Stack, runner_setup: tuple[RunnerProcs, str]) -> None:
    procs, token = runner_setup
    secret, pinned = split_token(token)
    headers = {"Authorization": f"Bearer {secret}"}
    assert httpx.post(f"{stack.url}/api/runner/heartbeat", headers=headers, json={}).status_code == 200
    session, turn = approved_command(world, "echo approved")
    # A compromised network path hands the runner the approved job with other arguments.
    response = httpx.post(f"{stack.url}/api/runner/jobs/next", headers=headers, params={"wait": 20}, timeout=40)
    assert response.status_code == 200, response.text
    envelope = response.json()
    verify_job(key=pinned, runner="cust-1", job=envelope["job"], signature=envelope["signature"])
    tampered = json.loads(json.dumps(envelope))
    tampered["job"]["arguments"] = {"command": "touch /workspace/pwned"}
    tampered["job"]["spec"]["arguments"] = tampered["job"]["arguments"]
    tampered["job"]["approval_sha256"] = spec_sha256(tampered["job"]["spec"])
    runner = Runner(url=stack.url, token=token, workdir=procs.workdir)
    runner.name = "cust-1"
    runner.run_job(tampered)
    turn = finished(turn, timeout=60)
    step = Step.objects.get(turn=turn, kind="tool")
    assert step.status == "failed" and step.error_code == "job_refused"
    assert Event.objects.filter(step=step, type="runner.job_refused", payload__reason="bad signature").exists()
    assert not (procs.workdir / "workspaces" / str(session.id) / "pwned").exists()
    # Signed with the right key but not what was approved: refused on the approval hash.
    key = runner_signing_key(SandboxHost.objects.get(name="cust-1"))
    forged = dict(envelope["job"], arguments={"command": "touch /workspace/pwned"})
    with pytest.raises(JobRefused, match="approval hash|not the approved"):
        verify_job(key=pinned, runner="cust-1", job=forged, signature=sign(key, forged))
    spec = dict(envelope["job"]["spec"], arguments=forged["arguments"])  # a self-consistent job, unapproved
    forged = dict(forged, spec=spec, approval_sha256=spec_sha256(spec))
    with pytest.raises(JobRefused, match="not the one the reviewer approved"):
        verify_job(key=pinned, runner="cust-1", job=forged, signature=sign(key, forged))

    # Revoked: the very next request is refused, the long-poll included; the runner process stops.
    proc = procs.start()
    wait_for(lambda: online("cust-1"), 60, "the runner online")
    revoked = api_client(world.operator).post("/api/runners/cust-1/revoke", {}, content_type="application/json")
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    assert httpx.post(f"{stack.url}/api/runner/jobs/next", headers=headers, params={"wait": 0}).status_code == 401
    assert proc.wait(timeout=30) == 3
    turn2 = turn_submit(session_id=session.id, input=script(tool("run_command", command="echo after"), "ok"))
    (approval,) = pending_approvals(turn2, timeout=60)
    approve(world.reviewer, approval)
    assert httpx.post(f"{stack.url}/api/runner/jobs/next", headers=headers, params={"wait": 1}).status_code == 401
    assert Step.objects.get(turn=turn2, kind="tool").status == "approved"  # nobody fetched it


def test_hosts_page_shows_each_host_with_status_load_and_self_test(
        world: World, stack: Stack, runner_setup: tuple[RunnerProcs, str], browser: Any) -> None:
    procs, _token = runner_setup
    stack.spawn("host", [sys.executable, "manage.py", "sandbox_host", "--name", "gpu-1", "--labels", "gpu,big",
                         "--capacity", "16", "--concurrency", "1"])
    procs.start()
    wait_for(lambda: online("cust-1") and online("gpu-1"), 90, "a hosted host and a runner online")
    page = login(browser, stack, world.operator.username, viewport={"width": 1400, "height": 520})
    page.goto(f"{stack.url}/hosts/")
    rows = page.locator("#hosts tbody tr")
    assert rows.count() == 2
    gpu, runner = page.locator("tr[data-host=gpu-1]"), page.locator("tr[data-host=cust-1]")
    assert "online" in gpu.inner_text() and "gpu" in gpu.inner_text() and "ok · bubblewrap" in gpu.inner_text()
    assert "runner · default" in runner.inner_text() and "online" in runner.inner_text()
    page.screenshot(path=str(SCREENSHOTS / "hosts.png"), full_page=True)


def test_runner_cut_off_mid_command_delivers_its_result_once(
        world: World, stack: Stack, runner_setup: tuple[RunnerProcs, str], proxy: CuttableProxy) -> None:
    procs, _token = runner_setup
    procs.start(url=proxy.url)
    wait_for(lambda: online("cust-1"), 60, "the runner online (through the proxy)")
    session, turn = approved_command(world, "touch started; sleep 3; echo ran >> runs.txt; echo done-once")
    step = Step.objects.get(turn=turn, kind="tool")
    started = procs.workdir / "workspaces" / str(session.id) / "started"
    wait_for(lambda: started.exists() or None, 60, "the command to start on the runner")
    proxy.cut.set()  # mid-command: from now on the runner hears nothing back
    # The command ends; the server records the result, the runner's connection drops, it sends again.
    wait_for(lambda: RunnerResult.objects.filter(step=step, deliveries__gte=2).exists() or None, 60,
             "the result recorded and sent again")
    assert Step.objects.get(pk=step.pk).status == "completed"
    proxy.cut.clear()  # reconnected: the next re-send is acknowledged and the runner forgets it
    pending = procs.workdir / "pending-results"
    wait_for(lambda: not any(pending.glob("*.json")) or None, 60, "the runner's kept result acknowledged")
    turn = finished(turn, timeout=60)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert RunnerResult.objects.filter(step=step).count() == 1
    assert Event.objects.filter(step=step, type="tool.completed").count() == 1
    step.refresh_from_db()
    assert (step.result or {})["output"].count("done-once") == 1
    runs = procs.workdir / "workspaces" / str(session.id) / "runs.txt"
    assert runs.read_text() == "ran\n"  # it ran once


def test_runner_killed_mid_command_is_asked_for_its_manifest_when_back(
        world: World, stack: Stack, runner_setup: tuple[RunnerProcs, str]) -> None:
    procs, _token = runner_setup
    ToolDefinition.objects.filter(name="run_command").update(timeout_seconds=3)
    procs.start()
    wait_for(lambda: online("cust-1"), 60, "the runner online")
    session, turn = approved_command(world, "echo changed > changed.txt; sleep 2")
    marker = procs.workdir / "workspaces" / str(session.id) / "changed.txt"
    wait_for(lambda: marker.exists() or None, 60, "the command to start on the runner")
    procs.kill_all()  # SIGKILL, mid-command: no result will ever come
    step = Step.objects.get(turn=turn, kind="tool")
    assert Step.objects.get(pk=step.pk).status == "running"
    assert (procs.workdir / "manifests" / f"{step.id}.json").exists()  # saved before the command ran
    procs.start()  # the runner is back (same work directory); its lease runs out (timeout 3 s + 2 s)
    wait_for(lambda: online("cust-1"), 60, "the runner online again")

    def swept_into_doubt() -> bool | None:
        sweep()  # the sweeper (Celery beat in production): the lease ran out → ask the runner
        return Step.objects.get(pk=step.pk).status == "in_doubt" or None

    wait_for(swept_into_doubt, 60, "the manifest check on the runner")
    assert Event.objects.filter(step=step, type="host.manifest_check", payload__host="cust-1").exists()
    assert Event.objects.filter(step=step, type="step.recovered", payload__checked_on_host=True,
                                payload__outcome="in_doubt").exists()
    assert ApprovalRequest.objects.filter(step=step, kind="recovery", status="pending").exists()
    assert not RunnerResult.objects.filter(step=step).exists()
