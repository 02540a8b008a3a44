"""Real processes for browser tests: daphne, a Celery worker and the scripted model, on free ports,
all on pytest-django's test database (``transactional_db``: what the test writes is committed)."""

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from agentops.embedded_redis import free_port
from agentops.run import wait_port
from sessions_app.models import AgentProfile, Turn
from tests import factories
from tests.helpers import database_url
from tools_app.models import ToolDefinition
from tools_app.selectors import TOOL_CACHE_SECONDS
from tools_app.services import tool_definitions_seed

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
PASSWORD = "pw"
STACK_APP_NAME = "agentops-e2e"  # the stack's processes, in pg_stat_activity
STACK_POOL_SIZE = 8  # connections per process of the stack


@pytest.fixture(autouse=True)
def _fast_passwords() -> None:
    """Overrides the suite's cheap password hasher: daphne, in its own process, checks the login
    form's password with the default hashers."""


@dataclass
class Stack:
    env: dict[str, str]
    web_port: int
    model_url: str
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def start_web(self) -> None:
        proc = self.spawn("web", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.web_port),
                                  "agentops.asgi:application"])
        wait_port(self.web_port, proc, "daphne")

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            proc = self.procs[name]
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name, proc in list(self.procs.items()):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
            self.procs.pop(name, None)


@pytest.fixture(scope="module")
def stack_env() -> dict[str, str]:
    """Extra environment of the stack's processes (a test module may override it)."""
    return {}


def _start_stack(stack_env: dict[str, str], logs: Path, workspace_root: Path, artifact_root: Path) -> Stack:
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL, "CELERY_BROKER_URL": settings.REDIS_URL,
        "AGENTOPS_WORKSPACE_ROOT": str(workspace_root), "AGENTOPS_ARTIFACT_ROOT": str(artifact_root),
        "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1",
        "DATABASE_APPLICATION_NAME": STACK_APP_NAME, "AGENTOPS_DB_POOL_SIZE": str(STACK_POOL_SIZE),
    })
    model_port = free_port()
    # Profiles with no endpoint of their own (those made through /openai/v1) use the scripted model.
    env.update({"OPENAI_BASE_URL": f"http://127.0.0.1:{model_port}/v1", **stack_env})
    s = Stack(env=env, web_port=free_port(), model_url=f"http://127.0.0.1:{model_port}/v1", logs=logs)
    try:
        model = s.spawn("model", [sys.executable, "manage.py", "scripted_model", "--port", str(model_port),
                                  "--quiet"])
        wait_port(model_port, model, "scripted model")
        s.spawn("worker", [sys.executable, "-m", "celery", "-A", "agentops", "worker", "-Q", "engine,sandbox,notify",
                           "--pool", "threads", "-c", "4", "-l", "warning", "--without-heartbeat",
                           "--without-gossip", "--without-mingle"])
        s.spawn("gateway", [sys.executable, "manage.py", "model_gateway", "--concurrency", "50"])
        s.start_web()
    except BaseException:
        s.stop_all()
        raise
    return s


STACK_PROCESSES = ("model", "worker", "gateway", "web")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember on the test whether a phase failed: ``stack`` then starts the next test on a fresh stack."""
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(scope="module")
def _module_stack(django_db_setup: None, stack_env: dict[str, str], workspace_base: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The stack's processes, started once per test module (four Python processes cost a 2-core
    machine ~6 s, which every e2e test paid): ``stack`` hands them to each test and starts them
    afresh when one has died or a test failed. They share the module's workspace and artifact
    roots; each test's rows are its own (the flush after a test deletes them; ids never repeat)."""
    workspace_root = workspace_base / uuid.uuid4().hex
    workspace_root.mkdir(mode=0o711)
    holder: dict[str, Any] = {"stack": None, "workspace_root": workspace_root,
                              "artifact_root": tmp_path_factory.mktemp("artifacts"),
                              "logs": tmp_path_factory.mktemp("stack-logs")}

    def fresh() -> Stack:
        if holder["stack"] is not None:
            holder["stack"].stop_all()
        holder["stack"] = _start_stack(stack_env, holder["logs"], workspace_root, holder["artifact_root"])
        return holder["stack"]

    holder["fresh"] = fresh
    try:
        yield holder
    finally:
        if holder["stack"] is not None:
            holder["stack"].stop_all()


@pytest.fixture
def stack(transactional_db: None, _module_stack: dict[str, Any], settings: Any,
          request: pytest.FixtureRequest) -> Iterator[Stack]:
    """daphne, a Celery worker, a model gateway and the scripted model on the test database, with
    this test's rows only. A process the test starts on the stack (``spawn``) is stopped after it."""
    s: Stack | None = _module_stack["stack"]
    if s is None or any(name not in s.procs or s.procs[name].poll() is not None for name in STACK_PROCESSES):
        s = _module_stack["fresh"]()
    else:
        # The processes keep the tool registry for TOOL_CACHE_SECONDS: the earlier test's definitions
        # (read up to the flush that just ended) must be forgotten before this test's are made.
        time.sleep(TOOL_CACHE_SECONDS + 0.2)
    assert s is not None
    settings.AGENTOPS_WORKSPACE_ROOT = _module_stack["workspace_root"]  # where the stack's processes write
    settings.AGENTOPS_ARTIFACT_ROOT = _module_stack["artifact_root"]
    offsets = {log: log.stat().st_size for log in s.logs.glob("*.log")}
    try:
        yield s
    finally:
        for name in [n for n in s.procs if n not in STACK_PROCESSES]:
            s.kill(name)
        for log in sorted(s.logs.glob("*.log")):
            # Shown by pytest only when the test failed: what the processes wrote during it.
            with log.open("rb") as f:
                f.seek(offsets.get(log, 0))
                print(f"--- {log.name} ---\n{f.read().decode(errors='replace')[-3000:]}")
        # The flush after the test deletes every row: the stack's worker and gateway must not be
        # driving a turn then (their writes and the flush's deadlocked). A turn still queued or
        # running a moment after the test, or a failed test, gets the next test fresh processes.
        if request.node.stash.get(_FAILED, False) or not _quiet(DRIVEN_TURN_GRACE_SECONDS):
            s.stop_all()
            _module_stack["stack"] = None


DRIVEN_TURN_GRACE_SECONDS = 5.0


def _quiet(seconds: float) -> bool:
    """Whether, within ``seconds``, no turn is queued or running (driven by the stack's processes)."""
    driven = Turn.objects.filter(status__in=[Turn.Status.QUEUED, Turn.Status.RUNNING])
    deadline = time.monotonic() + seconds
    while driven.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@dataclass
class World:
    operator: User
    reviewer: User
    agent: AgentProfile


@pytest.fixture
def world(stack: Stack) -> World:
    tool_definitions_seed()
    agent = factories.agent_profile(name="Scripted helper", slug="scripted", base_url=stack.model_url,
                                    model="scripted", max_tool_calls=20, max_tokens=100_000)
    agent.tools.set(ToolDefinition.objects.all())
    return World(operator=factories.user("operator", groups=["operators"], password=PASSWORD),
                 reviewer=factories.user("reviewer", groups=["reviewers"], password=PASSWORD), agent=agent)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(exist_ok=True)
    # Playwright's sync API keeps an event loop running in this thread, which trips Django's
    # async-safety check for the test's own ORM calls; nothing here runs in that loop.
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield b
            b.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


def login(browser: Any, stack: Stack, username: str, **context_options: Any) -> Any:
    """A fresh browser context logged in through the login form; returns its page."""
    context = browser.new_context(**context_options)
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto(f"{stack.url}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{stack.url}/")
    return page


def watch_console(page: Any) -> list[str]:
    """Collect CSP violations and page errors (an inline script or style would show up here)."""
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    return problems


@pytest.fixture
def runner_setup(world: World, stack: Stack, workspace_base: Path) -> Iterator[tuple[Any, str]]:
    """Runner ``cust-1`` of the default team (pool ``customer``, the agent's), made through the API:
    its runner processes (``runner_kit.RunnerProcs``, none started yet) and its token."""
    import uuid

    from hosts_app.models import AgentHostPolicy
    from tests.e2e.runner_kit import RunnerProcs
    from tests.helpers import api_client

    AgentHostPolicy.objects.create(agent=world.agent, pool="customer")
    response = api_client(world.operator).post("/api/runners", {"name": "cust-1", "team": "default",
                                                                "pool": "customer"},
                                               content_type="application/json")
    assert response.status_code == 201, response.content
    token = response.json()["token"]
    procs = RunnerProcs(stack, token, workspace_base / f"runner-{uuid.uuid4().hex[:8]}")
    yield procs, token
    procs.kill_all()


@pytest.fixture
def interceptor(stack: Stack) -> Iterator[Any]:
    """A man in the middle on the runner's path to daphne (``runner_kit.Interceptor``)."""
    from tests.e2e.runner_kit import Interceptor

    mitm = Interceptor(stack.url)
    yield mitm
    mitm.close()
