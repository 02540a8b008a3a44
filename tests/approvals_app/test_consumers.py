"""ws/approvals/: reviewers get approval events live, and those they missed on (re)connect."""

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.utils import timezone

from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_request_create
from sessions_app import services
from sessions_app.announce import approvals_group
from tests import factories
from tests.helpers import ws_communicator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("close_thread_connections")]


async def communicator(user: User | None) -> WebsocketCommunicator:
    return await ws_communicator("/ws/approvals/", user)


@database_sync_to_async
def make_request() -> ApprovalRequest:
    owner = factories.user(groups=["operators"])
    session = factories.session(owner=owner)
    turn = services.turn_create(session_id=session.id, input="please")
    step = factories.step(turn, tool_name="run_command", arguments={"command": "<b>ls</b>"})
    return approval_request_create(step_id=step.id)


@database_sync_to_async
def reviewer_user() -> User:
    return factories.user(groups=["reviewers"])


async def test_anonymous_and_unprivileged_are_refused() -> None:
    comm = await communicator(None)
    assert (await comm.connect()) == (False, 4401)
    await comm.disconnect()
    nobody = await database_sync_to_async(factories.user)("nobody")
    comm = await communicator(nobody)
    assert (await comm.connect()) == (False, 4403)
    await comm.disconnect()


async def test_missed_requests_on_connect_then_live() -> None:
    reviewer = await reviewer_user()
    since = timezone.now() - timedelta(minutes=5)
    approval = await make_request()
    comm = await communicator(reviewer)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "hello", "since": since.isoformat()})
    missed = await comm.receive_json_from(timeout=5)
    assert missed["event"]["type"] == "approval.requested"
    assert f'data-id="approval-{approval.request_id}"' in missed["html"]
    assert "&lt;b&gt;ls&lt;/b&gt;" in missed["html"]
    second = await make_request()
    live = await comm.receive_json_from(timeout=5)  # the next message: the backlog held nothing else
    assert live["event"]["payload"]["request_id"] == str(second.request_id)
    await comm.disconnect()


async def test_an_event_committed_while_the_backlog_is_read_is_sent_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request is committed (and announced) while the hello's backlog is read: it is in that
    backlog, and its live copy waits for the hello to end. The client gets it once."""
    from approvals_app import consumers

    reviewer = await reviewer_user()
    made: list[ApprovalRequest] = []
    load = consumers.load_approval_events

    def load_after_a_commit(*args: object) -> object:
        if not made:
            made.append(make_request.func())
        return load(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(consumers, "load_approval_events", load_after_a_commit)
    comm = await communicator(reviewer)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "hello", "since": timezone.now().isoformat()})
    first = await comm.receive_json_from(timeout=5)
    assert first["event"]["payload"]["request_id"] == str(made[0].request_id)
    second = await make_request()
    nxt = await comm.receive_json_from(timeout=5)  # not the first one again
    assert nxt["event"]["payload"]["request_id"] == str(second.request_id)
    await comm.disconnect()


async def test_a_long_backlog_is_sent_page_by_page_without_a_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("approvals_app.consumers.BACKLOG_PAGE", 2)
    reviewer = await reviewer_user()
    since = timezone.now() - timedelta(minutes=5)
    missed = [await make_request() for _ in range(5)]
    comm = await communicator(reviewer)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "hello", "since": since.isoformat()})
    backlog = [await comm.receive_json_from(timeout=5) for _ in range(5)]
    assert [m["event"]["payload"]["request_id"] for m in backlog] == [str(a.request_id) for a in missed]
    live = await make_request()
    assert (await comm.receive_json_from(timeout=5))["event"]["payload"]["request_id"] == str(live.request_id)
    await comm.disconnect()


async def test_forwards_the_senders_fragment_as_is() -> None:
    comm = await communicator(await reviewer_user())
    await comm.connect()
    await comm.send_json_to({"type": "hello", "since": timezone.now().isoformat()})
    message = {"type": "event.message", "html": "<template></template>",
               "event": {"seq": 7, "type": "approval.decided", "session_id": "x", "payload": {}}}
    team = await database_sync_to_async(factories.team)()
    await get_channel_layer().group_send(approvals_group(team.id), message)
    # The next message (an empty backlog sends nothing before it).
    assert await comm.receive_json_from(timeout=5) == {"type": "event", "event": message["event"],
                                                       "html": message["html"]}
    await comm.disconnect()


async def test_forwards_each_event_of_a_batch_in_order() -> None:
    comm = await communicator(await reviewer_user())
    await comm.connect()
    await comm.send_json_to({"type": "hello", "since": timezone.now().isoformat()})
    items = [{"html": f"<template>{n}</template>",
              "event": {"seq": n, "type": "approval.requested", "session_id": "x", "payload": {}}} for n in (8, 9)]
    team = await database_sync_to_async(factories.team)()
    await get_channel_layer().group_send(approvals_group(team.id), {"type": "event.batch", "items": items})
    assert [await comm.receive_json_from(timeout=5) for _ in items] == [{"type": "event", **i} for i in items]
    await comm.disconnect()
