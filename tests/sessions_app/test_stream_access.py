"""Streams keep checking access: a removed membership, a logout or a revoked token closes a
WebSocket or SSE stream within AGENTOPS_STREAM_RECHECK_SECONDS (here ~0.3 s); a stream past
AGENTOPS_STREAM_MAX_SECONDS asks the client to reconnect; replays are rate-limited."""

import asyncio
import json
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group
from django.contrib.sessions.models import Session
from django.test import AsyncClient, Client
from django.utils import timezone

from agentops.models import ApiToken, TeamMembership
from sessions_app.models import AgentSession
from tests import factories
from tests.helpers import api_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("close_thread_connections")]


@pytest.fixture(autouse=True)
def _fast_rechecks(settings: Any) -> None:
    settings.AGENTOPS_STREAM_RECHECK_SECONDS = 0.3


@database_sync_to_async
def _watcher() -> tuple[Any, AgentSession, str]:
    """A session, and a logged-in operator of its team with their browser session key."""
    user = factories.user(groups=["operators"])
    session = factories.session(owner=factories.user(groups=["operators"]))
    client = Client()
    client.force_login(user)
    return user, session, client.cookies["sessionid"].value


async def _connect(path: str, session_key: str) -> WebsocketCommunicator:
    from agentops.asgi import application

    comm = WebsocketCommunicator(application, path, headers=[(b"origin", b"http://testserver"),
                                                             (b"cookie", f"sessionid={session_key}".encode())])
    connected, _ = await comm.connect()
    assert connected
    return comm


async def _closed_within(comm: WebsocketCommunicator, seconds: float) -> tuple[list[dict[str, Any]], int]:
    """The messages until the server closes, and the close code; fails after ``seconds``."""
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while True:
        output = await comm.receive_output(timeout=max(0.05, deadline - time.monotonic()))
        if output["type"] == "websocket.close":
            return messages, output["code"]
        messages.append(json.loads(output["text"]))


async def test_removing_the_membership_closes_the_session_socket() -> None:
    user, session, key = await _watcher()
    comm = await _connect(f"/ws/sessions/{session.id}/", key)
    await comm.send_json_to({"type": "hello", "last_seq": 0})
    await database_sync_to_async(TeamMembership.objects.filter(user=user).delete)()
    started = time.monotonic()
    messages, code = await _closed_within(comm, 5)
    assert code == 4403 and messages[-1] == {"type": "closed", "reason": "access_revoked"}
    assert time.monotonic() - started < 3
    await comm.disconnect()


async def test_logging_out_closes_the_approvals_socket() -> None:
    user, _session, key = await _watcher()
    await database_sync_to_async(lambda: user.groups.add(Group.objects.get(name="reviewers")))()
    comm = await _connect("/ws/approvals/", key)
    await database_sync_to_async(Session.objects.filter(session_key=key).delete)()
    _messages, code = await _closed_within(comm, 5)
    assert code == 4403
    await comm.disconnect()


async def test_a_socket_past_its_max_life_is_told_to_reconnect(settings: Any) -> None:
    settings.AGENTOPS_STREAM_MAX_SECONDS = 0.5
    _user, session, key = await _watcher()
    comm = await _connect(f"/ws/sessions/{session.id}/", key)
    messages, code = await _closed_within(comm, 5)
    assert code == 4000 and messages[-1] == {"type": "reconnect", "reason": "max_life"}
    await comm.disconnect()


async def test_resends_are_rate_limited(settings: Any) -> None:
    settings.AGENTOPS_STREAM_REPLAYS_PER_MINUTE = 2
    _user, session, key = await _watcher()
    comm = await _connect(f"/ws/sessions/{session.id}/", key)
    await comm.send_json_to({"type": "hello", "last_seq": 0})
    assert (await comm.receive_json_from(timeout=5))["event"]["seq"] == 1
    for _ in range(2):
        await comm.send_json_to({"type": "resend", "after": 0, "until": 1})
        assert (await comm.receive_json_from(timeout=5))["event"]["seq"] == 1
    await comm.send_json_to({"type": "resend", "after": 0, "until": 1})
    assert (await comm.receive_json_from(timeout=5))["code"] == "throttled"
    await comm.disconnect()


def _sse(token: str, path: str, timeout: float = 10) -> str:
    async def read() -> str:
        response = await AsyncClient().get(path, headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200
        raw = ""
        async for chunk in response.streaming_content:  # type: ignore[attr-defined]
            raw += chunk.decode()
            if "id: 1\n" in raw and not getattr(read, "revoked", False):
                read.revoked = True  # type: ignore[attr-defined]
                await database_sync_to_async(ApiToken.objects.all().update)(revoked_at=timezone.now())
        return raw

    async def bounded() -> str:
        return await asyncio.wait_for(read(), timeout)

    return async_to_sync(bounded)()


def test_revoking_the_token_closes_the_sse_stream() -> None:
    operator = factories.user(groups=["operators"])
    session = factories.session(owner=operator)
    started = time.monotonic()
    raw = _sse(api_token(operator), f"/api/sessions/{session.id}/events/stream?max_seconds=8")
    assert raw.rstrip().endswith('event: access_revoked\ndata: {"reason": "access_revoked"}')
    assert time.monotonic() - started < 5


def test_an_sse_stream_past_its_max_life_says_reconnect(settings: Any) -> None:
    settings.AGENTOPS_STREAM_MAX_SECONDS = 0.5
    operator = factories.user(groups=["operators"])
    session = factories.session(owner=operator)
    token = api_token(operator)

    async def read() -> str:
        response = await AsyncClient().get(f"/api/sessions/{session.id}/events/stream?max_seconds=8",
                                           headers={"Authorization": f"Bearer {token}"})
        return "".join([c.decode() async for c in response.streaming_content])  # type: ignore[attr-defined]

    raw = async_to_sync(read)()
    assert "retry: 1000\nevent: reconnect\n" in raw and '"last_seq": 1' in raw


def test_sse_connections_are_rate_limited(settings: Any) -> None:
    settings.AGENTOPS_STREAM_REPLAYS_PER_MINUTE = 1
    operator = factories.user(groups=["operators"])
    session = factories.session(owner=operator)
    client = Client(headers={"Authorization": f"Bearer {api_token(operator)}"})
    path = f"/api/sessions/{session.id}/events/stream?max_seconds=0.1"
    assert client.get(path).status_code == 200
    refused = client.get(path)
    assert refused.status_code == 429 and refused.json()["code"] == "throttled"


def test_revoking_the_token_ends_the_openai_wire_event_stream() -> None:
    """The /openai/v1 event stream re-checks access like the other streams (it has no max life:
    the wire has no reconnect event)."""
    operator = factories.user(groups=["operators"])
    session = factories.session(owner=operator)
    token = api_token(operator)

    async def read() -> str:
        response = await AsyncClient().get(f"/openai/v1/agents/sessions/{session.id}/events",
                                           headers={"Authorization": f"Bearer {token}", "OpenAI-Beta": "agents=v1"})
        assert response.status_code == 200
        raw = ""
        async for chunk in response.streaming_content:  # type: ignore[attr-defined]
            if not raw:  # the first bytes (": ok") are out: now revoke
                await database_sync_to_async(ApiToken.objects.all().update)(revoked_at=timezone.now())
            raw += chunk.decode()
        return raw

    async def bounded() -> str:
        return await asyncio.wait_for(read(), 10)

    started = time.monotonic()
    assert async_to_sync(bounded)().startswith(": ok")
    assert time.monotonic() - started < 5


async def test_streams_that_connect_together_recheck_apart(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Watchers opened at once (a page of them, every browser after a deploy) would otherwise read
    the database in the same instant every interval, stalling the web process's live pushes: the
    first recheck comes at random within the interval, the next a whole interval later. The first
    checks' times are those the watchdogs scheduled (``spread``'s answers): when a loaded machine
    runs the check's thread late, the time it ran says nothing about the schedule."""
    from agentops import streamaccess

    settings.AGENTOPS_STREAM_RECHECK_SECONDS = 1.0
    checks: dict[str, list[float]] = {}
    firsts: list[float] = []
    spread = streamaccess.spread

    def recorded_spread(seconds: float, **kwargs: Any) -> float:
        cut = spread(seconds, **kwargs)
        if seconds == settings.AGENTOPS_STREAM_RECHECK_SECONDS:
            firsts.append(cut)
        return cut

    def still_allowed(credential: streamaccess.Credential, may: Any) -> bool:
        checks.setdefault(credential.value, []).append(time.monotonic())
        return True

    monkeypatch.setattr(streamaccess, "spread", recorded_spread)
    monkeypatch.setattr(streamaccess, "still_allowed", still_allowed)
    dogs = [streamaccess.Watchdog(None, streamaccess.Credential("token", str(n), 1), lambda user: True)
            for n in range(20)]
    for dog in dogs:
        dog.start()
    for _ in range(200):  # until each has checked twice (2 s unless the machine is slow)
        await asyncio.sleep(0.05)
        if len(checks) == 20 and all(len(times) >= 2 for times in checks.values()):
            break
    for dog in dogs:
        dog.stop()
    assert len(firsts) == 20 and len(checks) == 20
    assert all(0.5 <= first <= 1.0 for first in firsts), firsts
    assert max(firsts) - min(firsts) > 0.15, firsts  # not all at once
    assert all(times[1] - times[0] >= 0.9 for times in checks.values())  # then every interval
