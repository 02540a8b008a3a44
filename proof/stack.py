"""The product's real processes for a proof, each restartable, with a private Redis.

Processes (one per role, so a chaos loop can kill any one of them): the scripted model server,
daphne (``web``, ``web-2``, …: $AGENTOPS_WEB_PROCESSES processes on one listening socket held
here, as ``make run`` does), a Celery worker for ticks (``engine``), one for commands
(``sandbox``), the asyncio model gateway, the announcer (live events, ``sessions_app/relay.py``)
and Celery beat (the sweeper). Redis is a ``redis-server`` of the proof's own on a port of its own
(never the machine's: other people's workers use it); PostgreSQL is the machine's server with a
database of the proof's own. Everything is stopped on ``stop()``.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agentops import priority, webserve
from agentops.embedded_redis import redis_binary
from proof._common import ROOT

PY = sys.executable
# The roles make run starts at a lower CPU priority (agentops/priority.py).
BACKGROUND = ("worker-engine", "worker-sandbox", "gateway", "beat")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout: float = 60, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                if response.status == 200:
                    return
        except Exception as exc:  # not up yet
            last = str(exc)
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer 200 within {timeout:.0f}s ({last})")


def _wait_redis(port: int, proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"redis-server on port {port} did not start")


@dataclass
class Stack:
    database_url: str
    workspaces: Path
    extra_env: Mapping[str, str] = field(default_factory=dict)
    logs: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="agentops-proof-")))
    redis_port: int = field(default_factory=free_port)
    web_port: int = field(default_factory=free_port)
    model_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    web_socket: socket.socket | None = None
    web_processes: int | None = None  # None: as make run ($AGENTOPS_WEB_PROCESSES, default 2)

    @property
    def web_names(self) -> list[str]:
        return [name for name in self.commands if name.startswith("web")]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def model_url(self) -> str:
        return f"http://127.0.0.1:{self.model_port}/v1"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="agentops.settings",
                   DATABASE_URL=self.database_url, REDIS_URL=self.redis_url, CELERY_BROKER_URL=self.redis_url,
                   LOG_LEVEL="WARNING", AGENTOPS_WORKSPACE_ROOT=str(self.workspaces),
                   AGENTOPS_ARTIFACT_ROOT=str(self.workspaces) + "-artifacts", AGENTOPS_DB_POOL_SIZE="8")
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        self.web_socket = sock = webserve.listen("127.0.0.1", self.web_port)
        self.commands = {
            "redis": [redis_binary(), "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "no", "--dir", str(self.logs), "--loglevel", "warning"],
            "model": [PY, "-m", "scripted_model", "--port", str(self.model_port), "--quiet"],
            **{("web" if n == 0 else f"web-{n + 1}"): webserve.daphne_command(PY, sock)
               for n in range(self.web_processes or webserve.web_processes())},
            "worker-engine": [PY, "-m", "celery", "-A", "agentops", "worker", "-Q", "engine,notify", "--pool",
                              "threads", "-c", "4", "-l", "warning", "--without-gossip", "--without-mingle",
                              "-n", f"engine{os.getpid()}@%h"],
            "worker-sandbox": [PY, "-m", "celery", "-A", "agentops", "worker", "-Q", "sandbox", "--pool", "threads",
                               "-c", "4", "-l", "warning", "--without-gossip", "--without-mingle",
                               "-n", f"sandbox{os.getpid()}@%h"],
            "gateway": [PY, "manage.py", "model_gateway", "--concurrency", "100"],
            **webserve.announcer_commands(PY, self.env),
            "beat": [PY, "-m", "celery", "-A", "agentops", "beat", "-l", "warning",
                     "-s", str(self.logs / "beat-schedule")],
        }
        for name in self.commands:
            self.spawn(name)
            if name == "redis":
                _wait_redis(self.redis_port, self.procs[name])
            elif name == "model":
                wait_http(self.model_url + "/models", proc=self.procs[name])
        wait_http(self.url + "/healthz", timeout=120, proc=self.procs["web"])

    def spawn(self, name: str) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        fds = (self.web_socket.fileno(),) if name.startswith("web") and self.web_socket is not None else ()
        self.procs[name] = subprocess.Popen(self.commands[name], cwd=ROOT, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True, pass_fds=fds)
        if name in BACKGROUND:
            priority.background(self.procs[name].pid)  # as make run: the web answers first

    def kill(self, name: str) -> None:
        """SIGKILL the process and its children (its own process group): no clean-up of any kind."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def restart(self, name: str) -> None:
        self.kill(name)
        self.spawn(name)
        self.restarts[name] = self.restarts.get(name, 0) + 1
        if name == "redis":
            _wait_redis(self.redis_port, self.procs[name])

    def dead(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.poll() is not None]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        if self.web_socket is not None:
            self.web_socket.close()

    def remove_logs(self) -> None:
        """After a proof that passed: its logs are of no further use."""
        import shutil

        shutil.rmtree(self.logs, ignore_errors=True)

    def tail(self, name: str, chars: int = 2000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def start_watchers(url: str, ws_each: int, sse_each: int) -> subprocess.Popen[str]:
    """The WebSocket/SSE clients (``proof._watch``), logged in as the proof's operator; session ids
    go to its stdin, then ``replay`` and ``stop``; its last stdout line is the report."""
    from proof.world import PASSWORD

    proc = subprocess.Popen([PY, "-m", "proof._watch", url, "proof-operator", PASSWORD, str(ws_each), str(sse_each)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        raise RuntimeError(f"the watchers did not start: {line!r}")
    return proc
