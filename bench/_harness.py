"""Shared set-up of the engine benchmarks: own database, Redis db, a real Celery worker, the model.

Call ``configure()`` before importing anything from Django. The benchmarks never touch the
database named in DATABASE_URL: they use a database of their own on the same server
(``BENCH_DATABASE_NAME``, default ``bench_agentops``), created and migrated when missing.
"""

import asyncio
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/bench_agentops"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/9"


def _bench_database_url(url: str) -> str:
    name = os.environ.get("BENCH_DATABASE_NAME", "bench_agentops")
    parts = urlsplit(url)
    if not parts.scheme.startswith("postgres"):
        raise SystemExit(f"the benchmarks need PostgreSQL; DATABASE_URL is {url!r}")
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def _ensure_database(url: str, *, fresh: bool = False) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    with psycopg.connect(admin, autocommit=True) as conn:
        if fresh:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')


def configure(*, fresh_database: bool = False) -> dict[str, str]:
    """Set the environment (own database, Redis db 9, a fresh workspace root), set Django up, migrate.
    ``fresh_database``: drop the benchmark's database first (a run that starts sessions must not
    inherit an earlier run's unfinished ones: the sweeper would drive them beside the new ones)."""
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "agentops.settings"
    os.environ.setdefault("AGENTOPS_DEMO", "1")  # a local benchmark: the development secret key is fine
    database_url = _bench_database_url(os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL))
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("REDIS_URL", DEFAULT_REDIS_URL)
    os.environ.pop("CELERY_BROKER_URL", None)
    os.environ.setdefault("LOG_LEVEL", "WARNING")  # no log line per model request in the timings
    workspaces = tempfile.mkdtemp(prefix="agentops-bench-ws-")
    os.chmod(workspaces, 0o711)  # the sandbox uid must traverse it
    os.environ["AGENTOPS_WORKSPACE_ROOT"] = workspaces
    os.environ["AGENTOPS_ARTIFACT_ROOT"] = workspaces + "-artifacts"
    _ensure_database(database_url, fresh=fresh_database)

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return {"database": database_url, "redis": os.environ["REDIS_URL"], "workspaces": workspaces}


def bench_agent(slug: str, model_url: str) -> tuple[Any, Any]:
    """The benchmark's agent profile (every built-in tool, no budgets) on the scripted model, and its owner."""
    from django.contrib.auth.models import User

    from sessions_app.models import AgentProfile
    from tools_app.models import ToolDefinition
    from tools_app.services import tool_definitions_seed

    tool_definitions_seed()
    team = bench_team()
    profile, _ = AgentProfile.objects.update_or_create(
        slug=slug,
        defaults={"team": team, "name": slug.replace("-", " "), "model": "scripted", "base_url": model_url,
                  "instructions": "You are a benchmark agent.", "max_tool_calls": None, "max_model_calls": None,
                  "max_tokens": None, "max_wall_seconds": None, "enabled": True})
    profile.tools.set(ToolDefinition.objects.all())
    owner, _ = User.objects.get_or_create(username="bench-owner")
    bench_member(owner, "both")
    return profile, owner


def bench_team() -> Any:
    """The team every benchmark agent and session belongs to."""
    from agentops.models import Team

    return Team.objects.get_or_create(slug="bench", defaults={"name": "Benchmarks"})[0]


def bench_member(user: Any, role: str) -> None:
    """Make ``user`` a member of the benchmarks' team with ``role`` (operator, reviewer, both)."""
    from agentops.models import TeamMembership

    TeamMembership.objects.update_or_create(team=bench_team(), user=user, defaults={"role": role})


def start_model() -> tuple[Any, str]:
    """The scripted model on a thread of this process (a client closing a keep-alive connection
    makes the stdlib server print a ConnectionResetError traceback: kept out of the output)."""
    from scripted_model.server import start_in_thread

    server, url = start_in_thread(port=0)
    server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
    return server, url


def cleanup_workspaces() -> None:
    root = os.environ.get("AGENTOPS_WORKSPACE_ROOT", "")
    if root.startswith(tempfile.gettempdir() + "/agentops-bench-ws-"):
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(root + "-artifacts", ignore_errors=True)


class Worker:
    """The engine's real processes on our Redis db: a Celery worker subprocess (threads pool, queues
    engine and sandbox) and a model gateway subprocess (the model calls)."""

    def __init__(self, concurrency: int = 4) -> None:
        self.concurrency = concurrency
        fd, path = tempfile.mkstemp(prefix="agentops-bench-worker-", suffix=".log")
        self.log_path = Path(path)
        self.log = os.fdopen(fd, "wb")
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "agentops", "worker", "-Q", "engine,sandbox",
                "--pool", "threads", "-c", str(self.concurrency), "--loglevel", "WARNING",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"bench{os.getpid()}@%h", "--include", "_worker_tasks"]

    @property
    def gateway_command(self) -> list[str]:
        return [sys.executable, "manage.py", "model_gateway", "--concurrency", "100"]

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(BENCH_DIR)]))
        for command in (self.command, self.gateway_command):
            self.procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def check(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise SystemExit(f"{proc.args!r} exited ({proc.returncode}); see {self.log_path}:\n"
                                 + self.log_path.read_text()[-3000:])

    def stop(self, *, keep_log: bool = False) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # warm shutdown
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.log.close()
        if not keep_log:
            self.log_path.unlink(missing_ok=True)

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text()[-chars:]


class Listener:
    """Subscribes to channel-layer groups on its own event loop; records each message's arrival time."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-listener", daemon=True)
        self.thread.start()
        self.inbox: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self.channel = self._run(self._new_channel())
        self._reader = asyncio.run_coroutine_threadsafe(self._read(), self.loop)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    async def _new_channel(self) -> str:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        assert layer is not None
        name: str = await layer.new_channel()
        return name

    async def _read(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        assert layer is not None
        while True:
            message = await layer.receive(self.channel)
            self.inbox.put((time.perf_counter(), message))

    def subscribe(self, group: str) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        assert layer is not None
        self._run(layer.group_add(group, self.channel))

    def unsubscribe(self, group: str) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        assert layer is not None
        self._run(layer.group_discard(group, self.channel))

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout: float,
                 on_wait: Callable[[], None] | None = None) -> tuple[float, dict[str, Any]]:
        """The first message whose event matches (earlier, unmatched ones are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no matching message on the channel layer")
            try:
                arrived, message = self.inbox.get(timeout=min(left, 1.0))
            except queue.Empty:
                if on_wait is not None:
                    on_wait()
                continue
            from sessions_app.announce import unbatch

            for item in unbatch(message):  # one event, or a batch of them (the announcer's event.batch)
                event = item.get("event") or {}
                if match(event):
                    return arrived, event

    def close(self) -> None:
        self._reader.cancel()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def pct(samples: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``samples``; NaN when there are none."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(samples: list[float]) -> str:
    return (f"p50 {statistics.median(samples):7.2f} ms  p95 {pct(samples, 0.95):7.2f} ms  "
            f"max {max(samples):7.2f} ms")
