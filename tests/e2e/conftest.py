"""Real processes for browser tests: daphne, a Celery worker and the scripted model, on free ports,
all on pytest-django's test database (``transactional_db``: what the test writes is committed)."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from agentops.embedded_redis import free_port
from agentops.run import wait_port
from sessions_app.models import AgentProfile
from tests import factories
from tests.helpers import database_url
from tools_app.models import ToolDefinition
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


@pytest.fixture
def stack_env() -> dict[str, str]:
    """Extra environment of the stack's processes (a test module may override it)."""
    return {}


@pytest.fixture
def stack(transactional_db: None, tmp_path: Path, stack_env: dict[str, str]) -> Iterator[Stack]:
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL, "CELERY_BROKER_URL": settings.REDIS_URL,
        "AGENTOPS_WORKSPACE_ROOT": str(settings.AGENTOPS_WORKSPACE_ROOT),
        "AGENTOPS_ARTIFACT_ROOT": str(settings.AGENTOPS_ARTIFACT_ROOT),
        "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1",
        "DATABASE_APPLICATION_NAME": STACK_APP_NAME, "AGENTOPS_DB_POOL_SIZE": str(STACK_POOL_SIZE),
    })
    logs = tmp_path / "logs"
    logs.mkdir()
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
        yield s
    finally:
        s.stop_all()
        for log in sorted(logs.glob("*.log")):
            # Shown by pytest only when the test failed.
            print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}")


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
