import pytest
from django.contrib.auth.models import Group, User
from django.db import connection

from tests import factories


@pytest.fixture(autouse=True)
def _workspace_root(settings, tmp_path_factory: pytest.TempPathFactory) -> None:  # type: ignore[no-untyped-def]
    settings.AGENTOPS_WORKSPACE_ROOT = tmp_path_factory.mktemp("workspaces")
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
