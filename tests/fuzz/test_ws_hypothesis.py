"""Hypothesis against the WebSocket consumers (Channels communicator, the real ASGI application):
whatever a client sends (binary frames, text that is not JSON, NaN, NUL, huge integers, deep
nesting, unknown types, wrong field types), the connection stays open, each bad message gets an
error message in the API's ``{code, message, details}`` shape, and nothing is stored."""

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentops.asyncdb import MAX_MESSAGE_CHARS
from sessions_app import services
from sessions_app.models import AgentSession, Event
from tests import factories
from tests.helpers import ws_communicator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("close_thread_connections")]

EXAMPLES = 150

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
field_values = st.one_of(json_scalars, st.lists(json_scalars, max_size=2),
                         st.sampled_from(["1e999", "-1", "2020-13-45T00:00:00", "0001-01-01T00:00:00", "\x00", ""]))
frames: st.SearchStrategy[str | bytes] = st.one_of(
    st.binary(min_size=1, max_size=64),
    st.text(min_size=1, max_size=64),
    json_values.map(lambda v: json.dumps(v)),  # NaN and Infinity included: Python writes them
    st.fixed_dictionaries({"type": st.sampled_from(["hello", "resend", "", "HELLO", "event"])},
                          optional={"last_seq": field_values, "after": field_values, "until": field_values,
                                    "since": field_values}).map(json.dumps),
    st.integers(min_value=40, max_value=5000).map(lambda n: "[" * n + "]" * n),
    st.just(json.dumps({"type": "hello", "pad": "x" * MAX_MESSAGE_CHARS})),
    st.just('{"type": "hello", "last_seq": 1e400}'),
    st.just('{"type": "resend", "after": 18446744073709551616}'),
)


async def exchange(comm: WebsocketCommunicator, frame: str | bytes, n: int) -> list[dict[str, Any]]:
    """Send ``frame`` then a sentinel; return what came back before the sentinel's answer."""
    await (comm.send_to(bytes_data=frame) if isinstance(frame, bytes) else comm.send_to(text_data=frame))
    await comm.send_json_to({"type": f"sentinel-{n}"})
    received: list[dict[str, Any]] = []
    while True:
        output = await comm.receive_output(timeout=2)
        assert output["type"] == "websocket.send", output  # never a close
        message = json.loads(output["text"])
        if message.get("type") == "error" and f"sentinel-{n}" in message["message"]:
            return received
        received.append(message)


def assert_well_formed(message: dict[str, Any]) -> None:
    if message["type"] == "error":
        assert set(message) == {"type", "code", "message", "details"}, message
        assert message["code"] and message["message"] and isinstance(message["details"], dict), message
    else:
        assert message["type"] == "event" and isinstance(message["event"]["seq"], int), message


@pytest.fixture
def world(transactional_db: None) -> tuple[User, AgentSession]:
    owner = factories.user(groups=["operators", "reviewers"])
    session = factories.session(owner=owner, title="fuzz")
    services.turn_create(session_id=session.id, input="go")
    return owner, session


@database_sync_to_async
def stored() -> tuple[int, list[Any]]:
    return Event.objects.count(), list(AgentSession.objects.values_list("id", "status", "last_seq", "updated_at"))


@pytest.mark.parametrize("path", ["session", "approvals"])
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(frames, min_size=1, max_size=6))
async def test_websocket_answers_any_message_without_closing_or_storing(
        world: tuple[User, AgentSession], path: str, batch: list[str | bytes]) -> None:
    owner, session = world
    before = await stored()
    comm = await ws_communicator(f"/ws/sessions/{session.id}/" if path == "session" else "/ws/approvals/", owner)
    connected, _ = await comm.connect()
    assert connected
    try:
        for n, frame in enumerate(batch):
            for message in await exchange(comm, frame, n):
                assert_well_formed(message)
    finally:
        await comm.disconnect()
    assert await stored() == before


async def test_websocket_bad_message_examples_get_their_error_code(world: tuple[User, AgentSession]) -> None:
    """The examples of the issue, each with its code; the connection still serves a valid hello after them."""
    owner, session = world
    comm = await ws_communicator(f"/ws/sessions/{session.id}/", owner)
    await comm.connect()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"bytes_data": b"\x00\x01"}, "bad_message"),
        ({"text_data": "not json"}, "malformed_json"),
        ({"text_data": '{"type": "hello", "last_seq": NaN}'}, "malformed_json"),
        ({"text_data": '{"type": "hello", "last_seq": 9223372036854775808}'}, "malformed_json"),
        ({"text_data": "[" * 1000 + "]" * 1000}, "malformed_json"),
        ({"text_data": json.dumps({"type": "hello", "x": "y" * MAX_MESSAGE_CHARS})}, "message_too_large"),
        ({"text_data": '["hello"]'}, "bad_message"),
        ({"text_data": '{"type": "hello", "last_seq": "3"}'}, "invalid_arguments"),
        ({"text_data": '{"type": "hello", "last_seq": -1}'}, "invalid_arguments"),
        ({"text_data": '{"type": "resend", "after": 1}'}, "not_started"),
        ({"text_data": '{"type": "bye"}'}, "bad_message"),
    ]
    for frame, code in cases:
        await comm.send_to(**frame)
        message = await comm.receive_json_from(timeout=5)
        assert (message["type"], message["code"]) == ("error", code), (frame, message)
    await comm.send_json_to({"type": "hello", "last_seq": 0})
    first = await comm.receive_json_from(timeout=5)
    assert first["type"] == "event" and first["event"]["seq"] == 1
    await comm.disconnect()


async def test_approvals_hello_with_an_impossible_date_is_an_error(world: tuple[User, AgentSession]) -> None:
    owner, _session = world
    comm = await ws_communicator("/ws/approvals/", owner)
    await comm.connect()
    for since in ["2020-13-45T00:00:00", 17, "x" * 100, "2020-01-01T00:00:00+99:00"]:
        await comm.send_json_to({"type": "hello", "since": since})
        message = await comm.receive_json_from(timeout=5)
        assert (message["type"], message["code"]) == ("error", "invalid_arguments"), (since, message)
    # Valid, if early (year 1 minus the commit skew overflowed): the whole backlog, none here; then
    # a second hello is refused, which shows the first was taken.
    await comm.send_json_to({"type": "hello", "since": "0001-01-01T00:00:00"})
    await comm.send_json_to({"type": "hello"})
    message = await comm.receive_json_from(timeout=5)
    assert (message["type"], message["code"]) == ("error", "already_started"), message
    await comm.disconnect()
