"""A database connection cut under a request: 503 with Retry-After in the path's shape, nothing
changed, and the next request answers (agentops.errors). The cut is real: PostgreSQL terminates
this process's backends, as the chaos proof's ``pg_terminate_backend`` does to every process."""

import json
from collections.abc import Callable
from typing import Any

import psutil
import psycopg
import pytest
from django.db import connection
from django.test import Client, RequestFactory

from agentops.errors import server_error
from sessions_app.models import AgentSession
from tests import factories
from tests.helpers import api_client, database_url, login

on_postgres = pytest.mark.skipif(connection.vendor != "postgresql",
                                 reason="terminates PostgreSQL backends (CI runs the suite on PostgreSQL)")


def quiet(client: Client) -> Client:
    """The test client re-raises an error Django signals (one raised outside a view, which
    handler500 answers): here the answer is what is tested."""
    client.raise_request_exception = False
    return client


def cut_this_process_connections() -> int:
    """Terminate every PostgreSQL backend whose client is this process; the number terminated."""
    connection.ensure_connection()  # at least the test thread's own connection exists
    port = int(connection.settings_dict["PORT"] or 5432)
    ours = [c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED]
    with psycopg.connect(database_url().replace("postgres://", "postgresql://", 1), autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND client_port = ANY(%s) AND pid <> pg_backend_pid()) AS t",
            [ours]).fetchone()
    assert killed is not None and killed[0] >= 1, "no backend of this process to cut"
    return int(killed[0])


def _api_error(response: Any) -> bool:
    body = json.loads(response.content)
    return body["code"] == "database_unavailable" and body["details"] == {} and "Retry shortly" in body["message"]


def _wire_error(response: Any) -> bool:  # the openai SDK retries a 503 (server_error), after Retry-After
    error = json.loads(response.content)["error"]
    return error["code"] == "database_unavailable" and error["type"] == "server_error"


def _page(response: Any) -> bool:
    return b"The database is not answering" in response.content


@on_postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("path", "by", "shaped"), [
    ("/api/sessions", "token", _api_error),  # a query in the view: the API's handler
    ("/openai/v1/agents", "token", _wire_error),
    ("/sessions/", "login", _page),  # the session's user read in the view: handler500
])
def test_a_read_answers_503_in_its_shape_then_recovers(path: str, by: str,
                                                        shaped: Callable[[Any], bool]) -> None:
    user = factories.user(groups=["operators"])
    client = quiet(api_client(user) if by == "token" else login(user))
    assert client.get(path).status_code == 200

    cut_this_process_connections()
    response = client.get(path)

    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "1"
    assert shaped(response)
    assert client.get(path).status_code == 200  # the broken connections were dropped: the retry is served


@on_postgres
@pytest.mark.django_db(transaction=True)
def test_api_create_with_a_key_changes_nothing_and_the_key_stays_usable() -> None:
    operator = factories.user(groups=["operators"])
    agent = factories.agent_profile()
    client = quiet(api_client(operator))
    client.get("/api/sessions")
    payload = json.dumps({"agent": agent.slug, "input": "hello"})

    cut_this_process_connections()
    # The idempotency middleware's first query (whose token is this?) meets the cut: handler500's path.
    refused = client.post("/api/sessions", data=payload, content_type="application/json",
                          headers={"Idempotency-Key": "cut-1"})

    assert refused.status_code == 503, refused.content
    assert refused.json()["code"] == "database_unavailable"
    assert AgentSession.objects.count() == 0
    created = client.post("/api/sessions", data=payload, content_type="application/json",
                          headers={"Idempotency-Key": "cut-1"})
    assert created.status_code == 201, created.content
    assert AgentSession.objects.count() == 1


def test_other_server_errors_under_the_api_keep_the_json_shape() -> None:
    """handler500 for any other error outside a view: the API's JSON shape under /api/ and
    /openai/, Django's own page elsewhere."""
    factory = RequestFactory()
    try:
        raise RuntimeError("a bug in a middleware")
    except RuntimeError:
        api = server_error(factory.get("/api/sessions"))
        wire = server_error(factory.get("/openai/v1/agents"))
        page = server_error(factory.get("/sessions/"))
    assert api.status_code == wire.status_code == page.status_code == 500
    assert json.loads(api.content) == {"code": "internal_error",
                                       "message": "The server failed to handle this request.", "details": {}}
    assert json.loads(wire.content)["error"]["code"] == "internal_error"
    assert page["Content-Type"].startswith("text/html")
