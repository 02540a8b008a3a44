import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.db import connections

from tests import factories


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
    """A real Celery worker (in a thread) consuming every queue from the real Redis broker."""
    from celery.contrib.testing.worker import start_worker

    from agentops.celery import app

    app.conf.broker_connection_retry_on_startup = True
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False, loglevel="WARNING",
                      queues=["engine", "llm", "sandbox"], shutdown_timeout=30) as worker:
        yield worker


@pytest.fixture(scope="session")
def scripted_model_url() -> str:  # type: ignore[misc]
    """The scripted OpenAI-compatible model, served over real HTTP for the whole run."""
    from scripted_model.server import start_in_thread

    server, url = start_in_thread(port=0)
    yield url
    server.shutdown()
    server.server_close()


@pytest.fixture
def engine_agent(db: None, scripted_model_url: str) -> factories.AgentProfile:
    """An agent on the scripted model with every built-in tool."""
    from tools_app.models import ToolDefinition
    from tools_app.services import tool_definitions_seed

    tool_definitions_seed()
    profile = factories.agent_profile(base_url=scripted_model_url, model="scripted")
    profile.tools.set(ToolDefinition.objects.all())
    return profile
