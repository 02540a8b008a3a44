"""The web process's HTTP handler (agentops.asgi): each request in one worker-thread hop
(agentops.asgi_handler), the async views (the runner's API) through Django's own handler, a stream
ended by its client's disconnect. At the ASGI level, against the project's real application."""

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import ApplicationCommunicator
from django.contrib.auth.models import User

from agentops import asgi
from agentops.asgi_handler import OneHopASGIHandler
from tests import factories
from tests.helpers import api_token

pytestmark = pytest.mark.django_db(transaction=True)


def _scope(method: str, path: str, token: str = "", query: str = "") -> dict[str, Any]:
    headers = [(b"host", b"testserver")]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
            "raw_path": path.encode(), "query_string": query.encode(), "headers": headers,
            "client": ("127.0.0.1", 5000), "server": ("testserver", 80), "scheme": "http"}


async def _request(scope: dict[str, Any], body: bytes = b"") -> tuple[int, bytes]:
    app = ApplicationCommunicator(asgi.application, scope)
    await app.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await app.receive_output(30)
    chunks = []
    while True:
        message = await app.receive_output(30)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    await app.wait(5)
    return start["status"], b"".join(chunks)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths each request of the one-hop handler served (in its one worker-thread call)."""
    seen: list[str] = []
    real = OneHopASGIHandler._serve

    def serve(self: OneHopASGIHandler, scope: dict[str, Any], request: Any) -> Any:
        seen.append(scope["path"])
        return real(self, scope, request)

    monkeypatch.setattr(OneHopASGIHandler, "_serve", serve)
    return seen


def test_an_api_request_is_served_in_one_hop(operator: User, served: list[str]) -> None:
    status, body = async_to_sync(_request)(_scope("GET", "/api/sessions", api_token(operator), "limit=1"))
    assert status == 200 and json.loads(body)["items"] == []
    assert served == ["/api/sessions"]


def test_a_refusal_keeps_the_apis_error_shape(operator: User, served: list[str]) -> None:
    status, body = async_to_sync(_request)(_scope("GET", "/api/sessions/not-an-id", api_token(operator)))
    assert status == 404 and set(json.loads(body)) == {"code", "message", "details"}
    status, body = async_to_sync(_request)(_scope("POST", "/api/sessions", api_token(operator)), b"{not json")
    assert status == 400 and json.loads(body)["code"] == "malformed_json"


def test_the_runners_async_views_go_through_djangos_own_handler(served: list[str]) -> None:
    status, body = async_to_sync(_request)(_scope("POST", "/api/runner/heartbeat", "aor_unknown"), b"{}")
    assert status == 401
    assert served == []  # not through the synchronous chain: a long-poll there would hold a thread


def test_a_stream_ends_when_its_client_goes_away(operator: User, served: list[str]) -> None:
    session = factories.session(owner=operator)
    token = api_token(operator)

    async def scenario() -> None:
        app = ApplicationCommunicator(asgi.application, _scope(
            "GET", f"/api/sessions/{session.id}/events/stream", token))
        await app.send_input({"type": "http.request", "body": b"", "more_body": False})
        start = await app.receive_output(30)
        assert start["status"] == 200
        assert {k.lower(): v for k, v in start["headers"]}[b"content-type"] == b"text/event-stream"
        streamed = b""
        while b"session.created" not in streamed:  # a comment first, then the backlog
            streamed += (await app.receive_output(30))["body"]
        await app.send_input({"type": "http.disconnect"})
        await app.wait(10)  # the application returns: the stream stopped for the client that left

    async_to_sync(scenario)()
    assert served == [f"/api/sessions/{session.id}/events/stream"]


def test_concurrent_requests_each_get_an_answer(operator: User) -> None:
    token = api_token(operator)

    async def many() -> list[int]:
        return [status for status, _ in await asyncio.gather(
            *(_request(_scope("GET", "/api/sessions", token, "limit=1")) for _ in range(6)))]

    assert async_to_sync(many)() == [200] * 6
