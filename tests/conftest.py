import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connections

from scripted_model.server import ScriptedModelServer
from tests import factories
from tests.helpers import ROOT, WorkerFactory, database_url, redis_url_of_worker


def _isolate_xdist_worker() -> None:
    """Under pytest-xdist, each worker process gets a Redis database of its own (REDIS_URL's number
    plus the worker's index), so Celery queues, the gateway's stream and consumer group, Channels
    groups and kick markers never cross between workers. pytest-django already gives each worker
    its own test database (``_gw<N>``); workspace roots, artifact directories and the scripted model's
    port are per process anyway. Settings are read before conftest is imported, so they are set
    here too; the processes a test starts inherit the environment."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    url = redis_url_of_worker(settings.REDIS_URL, worker)
    if settings.CELERY_BROKER_URL == settings.REDIS_URL:
        settings.CELERY_BROKER_URL = url
        os.environ.pop("CELERY_BROKER_URL", None)
    os.environ["REDIS_URL"] = settings.REDIS_URL = url
    for layer in settings.CHANNEL_LAYERS.values():
        layer["CONFIG"] = {**dict(layer.get("CONFIG") or {}), "hosts": [url]}  # type: ignore[arg-type]
    from agentops.celery import app

    app.conf.update(broker_url=settings.CELERY_BROKER_URL)


_isolate_xdist_worker()


def _flush_by_delete() -> None:
    """A transactional test ends with a flush of every table. On PostgreSQL Django flushes with one
    TRUNCATE of all ~45 tables, which makes a new file for each table and index: 0.4-0.6 s here,
    paid by some 1,100 tests. A DELETE of each table removes the few rows a test wrote in ~10 ms.
    Every foreign key is DEFERRABLE INITIALLY DEFERRED (Django makes them so; a test below checks)
    and the flush runs in one transaction, so the order of the DELETEs does not matter. A flush that
    resets sequences (``manage.py flush``; a test's flush does not) keeps Django's TRUNCATE ...
    RESTART IDENTITY."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self: DatabaseOperations, style: Any, tables: Any, *, reset_sequences: bool = False,
                  allow_cascade: bool = False) -> list[str]:
        if reset_sequences:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return [f"DELETE FROM {self.quote_name(table)};" for table in tables]

    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign,assignment]


_flush_by_delete()


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    """Factories set a password on every user: hash it cheaply."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
async def close_thread_connections() -> AsyncIterator[None]:
    """For consumer tests (``usefixtures``): close the ORM's connection in asgiref's thread, whose
    kept-alive connection would otherwise block dropping the test database."""
    yield
    await database_sync_to_async(connections.close_all)()


@pytest.fixture(autouse=True)
def _fresh_channel_layer() -> None:
    """A channel layer of its own for each test. channels_redis keeps a receive's state (its lock,
    the event loop receiving) on the layer object, which the process shares, and each async test
    runs on a loop of its own: a consumer of an earlier test that was still receiving when its loop
    closed left that state behind ("Lock ... is bound to a different event loop")."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def _fresh_tool_cache() -> None:
    """The engine caches tool definitions for 2 s; each test starts from the database."""
    from tools_app.selectors import tool_definitions_cache_clear

    tool_definitions_cache_clear()


@pytest.fixture(scope="session")
def workspace_base() -> Iterator[Path]:
    """This run's directory for workspace roots: outside /tmp, reachable by the sandbox uid.

    The sandbox mounts a fresh tmpfs on /tmp, so a workspace root under /tmp stays hidden from a
    command even when the sandbox wrongly binds it in: the isolation tests could not see such a
    leak. The sandbox uid must also traverse every ancestor (bwrap opens the bind source as that
    uid), which pytest's private (0700) temp directories do not allow; /var/tmp is 1777.
    """
    base = Path(tempfile.mkdtemp(prefix="agentops-test-", dir="/var/tmp")).resolve()
    assert not base.is_relative_to("/tmp"), f"{base} is under /tmp, where the sandbox's own tmpfs hides it"
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _workspace_root(settings, workspace_base: Path,  # type: ignore[no-untyped-def]
                    tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh workspace root per test, under workspace_base."""
    root = workspace_base / uuid.uuid4().hex
    root.mkdir(mode=0o711)
    settings.AGENTOPS_WORKSPACE_ROOT = root
    settings.AGENTOPS_ARTIFACT_ROOT = tmp_path_factory.mktemp("artifacts")
    return root


@pytest.fixture
def operator(db: None) -> User:
    return factories.user("op", groups=["operators"])


@pytest.fixture
def reviewer(db: None) -> User:
    return factories.user("rev", groups=["reviewers"])


@pytest.fixture
def agent(db: None) -> factories.AgentProfile:
    return factories.agent_profile()


@pytest.fixture
def celery_worker(transactional_db: None):  # type: ignore[no-untyped-def]
    """A real Celery worker (in a thread) consuming the engine and sandbox queues from the real Redis broker."""
    from celery.contrib.testing.worker import start_worker

    from agentops.celery import app

    app.conf.broker_connection_retry_on_startup = True
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False, loglevel="WARNING",
                      queues=["engine", "sandbox"], shutdown_timeout=30) as worker:
        yield worker


@pytest.fixture
def notify_worker(transactional_db: None):  # type: ignore[no-untyped-def]
    """A real Celery worker (in a thread) consuming the notifications' queue, as make run's "notifier"
    does. Not together with ``celery_worker`` (two in-thread workers share Celery's stop flag): a
    test that needs both starts one with ``worker_process``."""
    from celery.contrib.testing.worker import start_worker

    from agentops.celery import app

    app.conf.broker_connection_retry_on_startup = True
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False, loglevel="WARNING",
                      queues=["notify"], shutdown_timeout=30) as worker:
        yield worker


@pytest.fixture
def model_gateway(transactional_db: None, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """A real model gateway (its own event loop, in a thread) reading the real Redis stream.
    ``@pytest.mark.gateway_watch(seconds)``: how often it looks for calls of settled steps."""
    from sessions_app.engine.gateway import run_in_thread

    marker = request.node.get_closest_marker("gateway_watch")
    gateway, thread = run_in_thread(concurrency=50, db_threads=4,
                                    watch_seconds=float(marker.args[0]) if marker else None)
    yield gateway
    gateway.stop_threadsafe()
    thread.join(30)


@pytest.fixture
def workers(celery_worker: object, model_gateway: object) -> None:
    """Everything that drives turns: a Celery worker (ticks, commands) and a model gateway."""


@pytest.fixture(scope="session")
def scripted_model() -> Iterator[ScriptedModelServer]:
    """The scripted OpenAI-compatible model, served over real HTTP for the whole run; its request
    log and call counts tell a test what the engine sent."""
    from scripted_model.server import start_in_thread

    server, _url = start_in_thread(port=0)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def scripted_model_url(scripted_model: ScriptedModelServer) -> str:
    return scripted_model.base_url


@pytest.fixture
def engine_agent(db: None, scripted_model_url: str) -> factories.AgentProfile:
    """An agent on the scripted model with every built-in tool."""
    from tools_app.models import ToolDefinition
    from tools_app.services import tool_definitions_seed

    tool_definitions_seed()
    profile = factories.agent_profile(base_url=scripted_model_url, model="scripted")
    profile.tools.set(ToolDefinition.objects.all())
    return profile


@pytest.fixture
def worker_process(transactional_db: None, tmp_path: Path) -> Iterator[WorkerFactory]:
    """Start real worker and gateway processes on the test database; all are killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(*, kind: str = "worker", failpoint: str = "", beat: bool = False,
              marker: Path | None = None, concurrency: int | None = None, queues: str = "engine,sandbox",
              extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """A Celery worker (``kind="worker"`` on ``queues``, with beat: the sweeper) or a model gateway."""
        env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL,
               "AGENTOPS_WORKSPACE_ROOT": str(settings.AGENTOPS_WORKSPACE_ROOT),
               "AGENTOPS_ARTIFACT_ROOT": str(settings.AGENTOPS_ARTIFACT_ROOT),
               # Short leases (a live gateway renews its own every third of one) and a fast sweeper; 3 s
               # rides out the stalls of a loaded 2-core machine (a 1 s lease expired under a live gateway).
               "AGENTOPS_LEASE_SECONDS": "3", "AGENTOPS_MODEL_TIMEOUT_SECONDS": "5", "AGENTOPS_SWEEP_SECONDS": "0.5",
               "AGENTOPS_FAILPOINT_AFTER_TOOL": failpoint, "AGENTOPS_FAILPOINT_MARKER": str(marker or ""),
               **(extra_env or {})}
        env.pop("DATABASE_TEST_NAME", None)
        if kind == "gateway":
            args = [sys.executable, "manage.py", "model_gateway", "--concurrency", str(concurrency or 50)]
        else:
            args = [sys.executable, "-m", "celery", "-A", "agentops", "worker", "-Q", queues,
                    "--pool", "threads", "-c", str(concurrency or 4), "-l", "warning", "-n", f"w{len(procs)}@%h"]
        if beat:
            args += ["-B", "--schedule", str(tmp_path / f"beat-{len(procs)}")]
        proc = subprocess.Popen(args, cwd=ROOT, env=env, start_new_session=True)
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="session", autouse=True)
def _close_database_pools(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """Close this process's connection pools before the test database is dropped (a pooled
    connection left open makes the drop fail: "being accessed by other users")."""
    yield
    with django_db_blocker.unblock():
        for conn in connections.all():
            close_pool = getattr(conn, "close_pool", None)  # PostgreSQL's wrapper only
            if close_pool is not None and getattr(conn, "pool", None) is not None:
                close_pool()
