"""What the customer-runner tests share: runner processes (``python -m agentops.runner``, no
database or broker in their environment), an approved command for them, and a man in the middle
on the runner's HTTP path (``Interceptor``: what a broken TLS path, a hostile proxy, could do)."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
from django.contrib.auth.models import User
from django.test import Client

from approvals_app.models import ApprovalRequest
from sessions_app.engine.commands import session_start
from sessions_app.models import AgentSession, Turn
from tests.e2e.conftest import ROOT, Stack, World
from tests.helpers import pending_approvals, script, tool


def approve(reviewer: User, approval: ApprovalRequest) -> None:
    client = Client()
    client.force_login(reviewer)
    response = client.post(f"/api/approvals/{approval.request_id}/decision",
                           json.dumps({"decision": "approve", "arguments_sha256": approval.arguments_sha256}),
                           content_type="application/json")
    assert response.status_code == 200, response.content


class RunnerProcs:
    def __init__(self, stack: Stack, token: str, workdir: Path) -> None:
        self.stack, self.token, self.workdir = stack, token, workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, url: str | None = None, token: str | None = None, **env: str) -> subprocess.Popen[bytes]:
        # Nothing of the server's: no database, no broker, no Django settings module.
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE", "REDIS", "DJANGO",
                                                                           "CELERY"))}
        log = (self.stack.logs / f"runner-{len(self.procs)}.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", "agentops.runner", "--url", url or self.stack.url, "--token",
                                 token or self.token, "--workdir", str(self.workdir), "--wait", "5"],
                                cwd=ROOT, env={**clean, **env}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def online(name: str) -> bool | None:
    from hosts_app.models import SandboxHost

    return SandboxHost.objects.filter(name=name, status="online").exists() or None


def approved_command(world: World, command: str) -> tuple[AgentSession, Turn]:
    """A session whose first step is ``run_command`` of ``command``, approved by the reviewer."""
    session, turn = session_start(agent=world.agent, owner=world.operator,
                                  input=script(tool("run_command", command=command), "say {results}"))
    assert turn is not None
    (approval,) = pending_approvals(turn, timeout=60)
    approve(world.reviewer, approval)
    return session, turn


class Interceptor:
    """An HTTP man in the middle between a runner and daphne. It passes every request on and reads
    everything (the runner's ``Authorization`` header, the jobs the server sends), and serves the
    runner's next poll a job of its own choosing (``serve``): a forged one, or a real one again."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.bearer = ""
        self.jobs: list[dict[str, Any]] = []  # every job envelope the server sent through it
        self.seen: list[tuple[str, bytes]] = []  # (path, body) of every request
        self.served: queue.Queue[dict[str, Any]] = queue.Queue()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def serve(self, envelope: dict[str, Any]) -> None:
        self.served.put(envelope)

    def posted(self, path_part: str) -> list[dict[str, Any]]:
        return [json.loads(body or b"{}") for path, body in list(self.seen) if path_part in path]

    def answers(self, job_id: str) -> int:
        """How many times the runner answered this job: refused it, or posted a result of it."""
        return sum(1 for path, _ in list(self.seen)
                   if path.startswith(f"/api/runner/jobs/{job_id}/") and path.endswith(("/refused", "/result")))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        mitm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                url = urlsplit(self.path)
                mitm.seen.append((url.path, body))
                mitm.bearer = self.headers.get("Authorization", "").removeprefix("Bearer ")
                polling = url.path.endswith("/jobs/next")
                if polling:
                    try:
                        self._answer(200, json.dumps(mitm.served.get_nowait()).encode())
                        return
                    except queue.Empty:
                        pass
                query = dict(parse_qsl(url.query))
                if polling:
                    query["wait"] = "1"  # short polls: a job to serve goes out within a second
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                try:
                    response = httpx.post(f"{mitm.target}{url.path}?{urlencode(query)}", content=body,
                                          headers=headers, timeout=60)
                except httpx.HTTPError:
                    self._answer(502, b"{}")
                    return
                if polling and response.status_code == 200:
                    mitm.jobs.append(response.json())
                self._answer(response.status_code, response.content,
                             response.headers.get("Content-Type", "application/json"))

        return Handler
