from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Group, User
from django.db import connection, connections

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


@pytest.fixture(autouse=True)
def _workspace_root(settings, tmp_path_factory: pytest.TempPathFactory) -> None:  # type: ignore[no-untyped-def]
    # The sandbox runs as an unprivileged uid: the workspace root must be traversable by it,
    # which pytest's private (0700) temp directory is not.
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp(prefix="agentops-test-ws-"))
    root.chmod(0o711)
    settings.AGENTOPS_WORKSPACE_ROOT = root
    settings.AGENTOPS_ARTIFACT_ROOT = tmp_path_factory.mktemp("artifacts")


@pytest.fixture
def operator(db: None) -> User:
    return factories.user("op", groups=["operators"])


@pytest.fixture
def reviewer(db: None) -> User:
    return factories.user("rev", groups=["reviewers"])


@pytest.fixture
def agent(db: None) -> factories.AgentProfile:
    return factories.agent_profile()


def requires_postgres() -> pytest.MarkDecorator:
    return pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL row locks")


__all__ = ["Group", "requires_postgres"]


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
    from sessions_app.scripted_model import start_in_thread

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
