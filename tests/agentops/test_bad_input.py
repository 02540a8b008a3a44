"""Malformed input found by the schemathesis and hypothesis runs (tests/fuzz/) and listed in
issue 12: each is a 4xx in the ``{code, message, details}`` shape, and changes nothing."""

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User

from agentops.parser import MAX_DEPTH
from sessions_app.models import AgentProfile, AgentSession, Event, Turn
from tests import factories
from tests.helpers import api_client, login

pytestmark = pytest.mark.django_db


def counts() -> tuple[int, int, int]:
    return AgentSession.objects.count(), Turn.objects.count(), Event.objects.count()


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "message", "details"} and body["code"] == code, body
    return body


@pytest.mark.parametrize(("raw", "reason"), [
    ('{"agent": "%s", "input": "a\\u0000b"}', "NUL"),  # was a DataError from PostgreSQL: 500
    ('{"agent": "%s\\u0000", "input": "x"}', "NUL"),
    ('{"agent": "%s", "input": "x", "metadata": {"k\\u0000": 1}}', "NUL"),
    ('{"agent": "%s", "input": "\\ud800"}', "surrogate"),
    ('{"agent": "%s", "input": "x", "budget": {"max_tokens": NaN}}', "NaN"),
    ('{"agent": "%s", "input": "x", "budget": {"max_tokens": Infinity}}', "Infinity"),
    ('{"agent": "%s", "input": "x", "metadata": {"n": 1e400}}', "out of range"),
    ('{"agent": "%s", "input": "x", "budget": {"max_tokens": 9223372036854775808}}', "64 bits"),
    ('{"agent": "%s", "input": "x", "metadata": {"n": -9223372036854775809}}', "64 bits"),
    ('{"agent": "%s", "input": "x", "metadata": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}", "nested"),
])
def test_api_json_nothing_below_can_hold_is_400_and_creates_nothing(operator: User, agent: AgentProfile,
                                                                    raw: str, reason: str) -> None:
    before = counts()
    response = api_client(operator).post("/api/sessions", raw % agent.slug, content_type="application/json")
    body = assert_error(response, 400, "malformed_json")
    assert reason in body["details"]["error"]
    assert counts() == before


def test_api_json_limits_keep_what_is_valid(operator: User, agent: AgentProfile) -> None:
    """The edge values themselves are accepted: 2^63-1, nesting just under the limit, non-ASCII."""
    metadata = {"big": 2**63 - 1, "small": -(2**63), "deep": json.loads("[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2)),
                "text": "héllo ✓ \u202e"}
    response = api_client(operator).post("/api/sessions", {"agent": agent.slug, "metadata": metadata},
                                         content_type="application/json")
    assert response.status_code == 201, response.content
    assert AgentSession.objects.get().metadata == metadata


@pytest.mark.parametrize("text", ["   ", "\n\t ", "\u00a0"])
def test_api_whitespace_only_input_is_422(operator: User, agent: AgentProfile, text: str) -> None:
    before = counts()
    body = assert_error(api_client(operator).post("/api/sessions", {"agent": agent.slug, "input": text},
                                                  content_type="application/json"), 422, "invalid_arguments")
    assert body["details"] == {"field": "input"}
    session = factories.session(agent=agent, owner=operator)
    before = counts()
    assert_error(api_client(operator).post(f"/api/sessions/{session.id}/turns", {"input": text},
                                           content_type="application/json"), 422, "invalid_arguments")
    assert counts() == before


@pytest.mark.parametrize("query", ["q=%00", "agent=a%00", "status=%00", "cursor=%00", "q=x&%00=1"])
def test_api_nul_in_the_query_string_is_400(operator: User, query: str) -> None:
    assert_error(api_client(operator).get(f"/api/sessions?{query}"), 400, "bad_request")
    assert_error(api_client(operator).get(f"/api/approvals?{query}"), 400, "bad_request")


def test_pages_refuse_nul_in_the_url_too(operator: User) -> None:
    assert_error(login(operator).get("/sessions/?q=%00"), 400, "bad_request")


@pytest.mark.parametrize("query", ["after=9223372036854775808", "after=-1", "after=1e3"])
def test_api_events_after_out_of_range_is_422(operator: User, query: str) -> None:
    session = factories.session(owner=operator)
    assert_error(api_client(operator).get(f"/api/sessions/{session.id}/events?{query}"), 422, "invalid_arguments")
    assert_error(api_client(operator).get(f"/api/sessions/{session.id}/events/stream?{query}"), 422,
                 "invalid_arguments")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e308"])
def test_api_stream_max_seconds_must_be_a_sane_number(operator: User, value: str) -> None:
    session = factories.session(owner=operator)
    assert_error(api_client(operator).get(f"/api/sessions/{session.id}/events/stream?max_seconds={value}"), 422,
                 "invalid_arguments")


# --- bodies over the limit, through the ASGI application (what daphne runs) ----------------------------------------

def asgi_post(path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes, int]:
    """POST ``chunks`` as a streamed body to the real ASGI application; returns the status, the
    body and how many chunks the application took before it answered."""
    from agentops.asgi import application

    taken = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal taken
        if taken < len(chunks):
            taken += 1
            return {"type": "http.request", "body": chunks[taken - 1], "more_body": taken < len(chunks)}
        await asyncio.Event().wait()  # the client stays connected until the response is sent
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"), *headers],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    async_to_sync(application)(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body, taken


@pytest.mark.django_db(transaction=True)
def test_asgi_streamed_body_over_the_limit_is_413_before_it_is_read_whole(settings: Any) -> None:
    settings.AGENTOPS_MAX_REQUEST_BYTES = 1000
    chunks = [b"x" * 400] * 100  # 40 kB, chunked: no Content-Length
    status, body, taken = asgi_post("/api/sessions", chunks, [])
    assert status == 413
    assert json.loads(body)["code"] == "payload_too_large"
    assert taken == 3  # 1200 bytes read, not 40 000
    assert counts() == (0, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_asgi_declared_length_over_the_limit_is_413_before_any_byte_is_read(settings: Any) -> None:
    settings.AGENTOPS_MAX_REQUEST_BYTES = 1000
    status, body, taken = asgi_post("/api/sessions", [b"x" * 5000], [(b"content-length", b"5000")])
    assert (status, taken) == (413, 0)
    assert json.loads(body)["details"]["limit"] == 1000


def test_the_openai_wire_refuses_a_body_over_the_limit_in_its_own_envelope(settings: Any) -> None:
    """It came back in agentops's envelope, which the openai SDK does not read."""
    settings.AGENTOPS_MAX_REQUEST_BYTES = 1000
    status, body, _ = asgi_post("/openai/v1/agents", [b"x" * 5000], [(b"content-length", b"5000")])
    assert status == 413 and json.loads(body)["error"]["code"] == "payload_too_large"


def test_the_openai_wire_refuses_in_its_own_envelope(settings: Any, operator: User) -> None:
    """A NUL in the URL under /openai/ came back in agentops's envelope; the wire's invalid
    parameters were 422s (the SDK's 422 is a reused Idempotency-Key)."""
    nul = api_client(operator).get("/openai/v1/agents/sessions?limit=%00")
    assert nul.status_code == 400 and nul.json()["error"]["code"] == "bad_request"
    agent = factories.agent_profile()
    long_input = api_client(operator).post("/openai/v1/agents/sessions", json.dumps(
        {"environment": {"type": "none"}, "agent_id": agent.slug, "input": "x" * 200_001}),
        content_type="application/json")
    assert long_input.status_code == 400, long_input.content
    assert long_input.json()["error"]["param"] == "input"


@pytest.mark.django_db(transaction=True)
def test_asgi_streamed_body_under_the_limit_reaches_the_api() -> None:
    user = factories.user(groups=["operators"])
    agent = factories.agent_profile()
    from tests.helpers import api_token

    raw = json.dumps({"agent": agent.slug, "title": "streamed"}).encode()
    status, body, _ = asgi_post("/api/sessions", [raw[:10], raw[10:20], raw[20:]],
                                [(b"authorization", f"Bearer {api_token(user)}".encode())])
    assert status == 201, body
    assert AgentSession.objects.get().title == "streamed"
