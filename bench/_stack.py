"""The product's real processes for the load benchmarks, in a named layout, on this one machine.

Layouts:
- ``multi``: the README's multi-host layout, collapsed onto one host: daphne (``web_processes``
  of them on one listening socket, as ``make run`` serves), a Celery worker
  (ticks and commands, ``-P threads -c 16``, beat for the sweeper), two model gateways (one per
  core) and the announcer (live events), every process with its own bounded connection pool;
  PostgreSQL and Redis of the machine.
- ``make-run``: exactly what ``make run`` starts (``python -m agentops.run``): SQLite, an embedded
  Redis, its daphne processes, one Celery worker (-c 8, with beat), one gateway, the announcer,
  default settings.

The scripted model runs as a process of its own (``python -m scripted_model``), so its CPU is
measured apart from the product's.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agentops import priority, webserve  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
PY = sys.executable
APP_NAME = "agentops-bench"  # PostgreSQL application_name of every product process


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_http(url: str, timeout: float = 60, proc: subprocess.Popen[bytes] | None = None, ok: int = 200) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                if response.status == ok:
                    return
        except Exception as exc:  # not up yet
            last = str(exc)
        time.sleep(0.3)
    raise SystemExit(f"{url} did not answer {ok} within {timeout:.0f}s ({last})")


@dataclass
class Stack:
    layout: str
    env: dict[str, str]
    web_port: int
    model_url: str
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    live_port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def spawn(self, name: str, args: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, pass_fds=pass_fds)
        self.procs[name] = proc
        return proc

    def product_processes(self) -> list[psutil.Process]:
        """Every process of the product (the model server excluded), children included."""
        found = []
        for name, proc in self.procs.items():
            if name == "model" or proc.poll() is not None:
                continue
            try:
                root = psutil.Process(proc.pid)
                found += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        return [p for p in found if "redis-server" not in " ".join(_cmdline(p))]

    def processes_by_name(self) -> dict[str, list[psutil.Process]]:
        """Each spawned process with its children (the model server's and PostgreSQL's included:
        they share the machine), for a CPU breakdown."""
        found: dict[str, list[psutil.Process]] = {}
        for name, proc in self.procs.items():
            try:
                root = psutil.Process(proc.pid)
                found[name] = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        postgres = [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("postgres")]
        redis = [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("redis-server")]
        return {**found, "postgres": postgres, "redis": redis}

    def model_stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.model_url.removesuffix("/v1") + "/_stats", timeout=5) as response:
            stats: dict[str, Any] = json.loads(response.read())
            return stats

    def model_log(self, after: int = 0) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.model_url.removesuffix("/v1") + f"/_log?after={after}",
                                    timeout=30) as response:
            entries: list[dict[str, Any]] = json.loads(response.read())
            return entries

    def check(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise SystemExit(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def start_model(logs: Path, layout: str = "model") -> Stack:
    """A stack of one process: the scripted model (``python -m scripted_model``)."""
    # AGENTOPS_PUSH_TIMINGS: each announcement carries its stage times (the push summary splits them)
    env = dict(os.environ, PYTHONUNBUFFERED="1", AGENTOPS_PUSH_TIMINGS="1")
    env.setdefault("AGENTOPS_DEMO", "1")  # a local benchmark: the development secret key is fine
    env.pop("DJANGO_SETTINGS_MODULE", None)
    model_port = free_port()
    stack = Stack(layout=layout, env=env, web_port=0, model_url=f"http://127.0.0.1:{model_port}/v1", logs=logs)
    stack.spawn("model", [PY, "-m", "scripted_model", "--port", str(model_port), "--quiet"])
    wait_http(stack.model_url + "/models", proc=stack.procs["model"])
    return stack


def start(layout: str, *, database_url: str, redis_url: str, workspaces: str, web_processes: int = 2,
          live_processes: int = 0) -> Stack:
    """Start the layout's processes; if one fails to come up, stop those already started.
    ``live_processes``: daphnes of their own, on a port of their own (``Stack.live_port``), for
    the WebSocket watchers, as a proxy that routes ``/ws/`` to a pool of its own would."""
    logs = Path(tempfile.mkdtemp(prefix=f"agentops-bench-{layout}-"))
    stack = start_model(logs, layout)
    try:
        return _start_product(stack, layout, database_url=database_url, redis_url=redis_url, workspaces=workspaces,
                              web_processes=web_processes, live_processes=live_processes)
    except BaseException:
        stack.stop()  # else a stack that did not come up kept running (and working) after the benchmark
        raise


def _start_product(stack: Stack, layout: str, *, database_url: str, redis_url: str, workspaces: str,
                   web_processes: int, live_processes: int) -> Stack:
    stack.web_port = free_port()
    env = stack.env
    env.update(LOG_LEVEL="WARNING", AGENTOPS_WORKSPACE_ROOT=workspaces,
               AGENTOPS_ARTIFACT_ROOT=workspaces + "-artifacts", DATABASE_APPLICATION_NAME=APP_NAME)
    if layout == "make-run":
        env.pop("REDIS_URL", None)
        env.pop("CELERY_BROKER_URL", None)
        env["DATABASE_URL"] = database_url  # a SQLite file of the benchmark's own
        env["PORT"] = str(stack.web_port)
        env["OPENAI_BASE_URL"] = stack.model_url  # make run's own scripted model stays off
        stack.spawn("make-run", [PY, "-m", "agentops.run"])
        wait_http(stack.url + "/healthz", timeout=120, proc=stack.procs["make-run"])
        return stack
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url, CELERY_BROKER_URL=redis_url)
    # Connection budget (default max_connections 100; ours ≤ 60): daphne 8 each, worker 10, 2
    # gateways × 10, the announcer 4, beat inside the worker; the benchmark's own process 4.
    pools = {"web": "8", "worker": "10", "gateway": "10", "announcer": "4"}
    # The background roles at a lower CPU priority than daphne and the announcer, as make run and
    # the README's layout run them (agentops/priority.py).
    priority.background(stack.spawn("worker", [
        PY, "-m", "celery", "-A", "agentops", "worker", "-B", "-Q", "engine,sandbox,notify", "--pool", "threads",
        "-c", "16", "-l", "warning", "--without-gossip", "--without-mingle",
        "--schedule", str(stack.logs / "beat-schedule")]).pid)
    stack.env = dict(env, AGENTOPS_DB_POOL_SIZE=pools["gateway"])
    for n in (1, 2):
        priority.background(stack.spawn(f"gateway{n}", [PY, "manage.py", "model_gateway", "--concurrency", "600",
                                                        "--db-threads", "2"]).pid)
    stack.env = dict(env, AGENTOPS_DB_POOL_SIZE=pools["announcer"])
    for name, command in webserve.announcer_commands(PY, stack.env).items():
        stack.spawn(name, command)
    stack.env = dict(env, AGENTOPS_DB_POOL_SIZE=pools["web"])
    # One listening socket (a backlog for bursts of connections), adopted by each daphne; a
    # WebSocket handshake window wider than daphne's 5 s for a busy process (else it resets the client).
    sock = webserve.listen("127.0.0.1", stack.web_port)
    try:
        for n in range(web_processes):
            stack.spawn("web" if n == 0 else f"web-{n + 1}", webserve.daphne_command(PY, sock),
                        pass_fds=(sock.fileno(),))
    finally:
        sock.close()  # the children hold it
    if live_processes:
        stack.live_port = free_port()
        lsock = webserve.listen("127.0.0.1", stack.live_port)
        try:
            for n in range(live_processes):
                stack.spawn(f"live-{n + 1}", webserve.daphne_command(PY, lsock), pass_fds=(lsock.fileno(),))
        finally:
            lsock.close()
    stack.env = env
    wait_http(stack.url + "/healthz", timeout=120, proc=stack.procs["web"])
    return stack
