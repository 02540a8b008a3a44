"""The announcer process (``manage.py announcer``): writers relay their committed events to it and
it renders and sends them; without one alive, every writer announces by itself."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

from agentops.dispatch import redis_client
from sessions_app import announce
from sessions_app.events import event_record
from sessions_app.relay import last_id_key
from tests import factories
from tests.helpers import ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)


def _start_announcer(*args: str, shards: int = 1) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL,
           "AGENTOPS_ANNOUNCERS": str(shards)}
    env.pop("DATABASE_TEST_NAME", None)
    return subprocess.Popen([sys.executable, "manage.py", "announcer", *args], cwd=ROOT, env=env,
                            start_new_session=True)


def _wait_alive(proc: subprocess.Popen[bytes], shard: int = 0) -> None:
    deadline = time.monotonic() + 30
    while not redis_client().exists(announce.relay_alive_key(shard)):
        assert proc.poll() is None, "the announcer exited"
        assert time.monotonic() < deadline, "the announcer never said it is alive"
        time.sleep(0.05)
    announce._relay_state["checked_at"] = -1e9  # this process asks again at once


@pytest.fixture
def clean_relay() -> Iterator[None]:
    client = redis_client()
    keys = [key for shard in (0, 1) for key in (announce.relay_alive_key(shard), announce.relay_stream(shard),
                                                last_id_key(shard))]
    client.delete(*keys)
    announce._relay_state["checked_at"] = -1e9
    yield
    client.delete(*keys)
    announce._relay_state["checked_at"] = -1e9


def _next_items(layer: Any, channel: str, seq: int) -> dict[str, Any]:
    """The announcement of event ``seq`` on ``channel`` (earlier ones of the session may come first)."""
    while True:
        for item in announce.unbatch(async_to_sync(asyncio.wait_for)(layer.receive(channel), 15)):
            if item["event"]["seq"] == seq:
                return item


def _rendered_here(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The events this process renders from now on (the writer's own announcements), in order."""
    rendered: list[dict[str, Any]] = []
    real = announce.fragments_renderer
    assert real is not None

    def counting(events: list[dict[str, Any]]) -> list[str]:
        rendered.extend(events)
        return real(events)

    monkeypatch.setattr(announce, "fragments_renderer", counting)
    return rendered


def _relayed_seqs(count: int) -> list[int]:
    """The seqs of the newest ``count`` entries of the relay stream, oldest first."""
    entries = redis_client().xrevrange(announce.RELAY_STREAM, count=count)
    return [int(json.loads(fields[b"e"])["seq"]) for _, fields in reversed(entries)]  # type: ignore[arg-type]


def test_with_an_announcer_alive_the_writer_relays_and_renders_nothing_itself(
        clean_relay: None, monkeypatch: pytest.MonkeyPatch, operator: Any, agent: Any) -> None:
    session = factories.session(agent=agent, owner=operator)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(announce.session_group(session.id), channel)
    proc = _start_announcer()
    try:
        _wait_alive(proc)
        rendered_here = _rendered_here(monkeypatch)
        event = event_record(session_id=session.id, type="session.status_changed", payload={"status": "idle"})
        # Relayed by the committing thread itself, before the write returned (no hop to a thread of
        # this process that would wait for the GIL behind the writer), and a transaction's events
        # in one go, in order.
        assert _relayed_seqs(1) == [event.seq]
        with transaction.atomic():
            pair = [event_record(session_id=session.id, type="note.added", payload={"n": n}).seq for n in (1, 2)]
            assert _relayed_seqs(2) == [event.seq]  # nothing before the commit
        assert _relayed_seqs(2) == pair
        got = _next_items(layer, channel, event.seq)
        assert 'data-target="#session-status"' in got["html"]  # rendered, by the announcer process
        assert event.seq not in [e["seq"] for e in rendered_here]  # not by the writer
        assert int(redis_client().xlen(announce.RELAY_STREAM)) >= 1  # type: ignore[arg-type]

        # The announcer stops (it says so): the writer announces by itself again.
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        assert not redis_client().exists(announce.RELAY_ALIVE_KEY)
        announce._relay_state["checked_at"] = -1e9
        after = event_record(session_id=session.id, type="session.status_changed", payload={"status": "idle"})
        assert 'data-target="#session-status"' in _next_items(layer, channel, after.seq)["html"]
        assert after.seq in [e["seq"] for e in rendered_here]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        async_to_sync(layer.group_discard)(announce.session_group(session.id), channel)


def test_a_restarted_announcer_sends_what_was_relayed_while_it_was_down(
        clean_relay: None, operator: Any, agent: Any) -> None:
    session = factories.session(agent=agent, owner=operator)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(announce.session_group(session.id), channel)
    first = _start_announcer()
    second = None
    try:
        _wait_alive(first)
        seen = event_record(session_id=session.id, type="note.added", payload={"text": "one"})
        _next_items(layer, channel, seen.seq)
        os.killpg(first.pid, signal.SIGKILL)  # its heartbeat key outlives it for a few seconds
        first.wait()
        assert announce.relay_alive()
        relayed = event_record(session_id=session.id, type="note.added", payload={"text": "two"})
        deadline = time.monotonic() + 10
        while int(redis_client().xlen(announce.RELAY_STREAM)) < 2:  # type: ignore[arg-type]  # relayed by the writer
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = _start_announcer()
        assert _next_items(layer, channel, relayed.seq)["event"]["payload"] == {"text": "two"}
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        async_to_sync(layer.group_discard)(announce.session_group(session.id), channel)


def test_announcers_share_the_sessions_by_shard_and_a_shard_without_one_is_announced_by_the_writer(
        clean_relay: None, monkeypatch: pytest.MonkeyPatch, settings: Any, operator: Any, agent: Any) -> None:
    settings.AGENTOPS_ANNOUNCERS = 2
    sessions: dict[int, Any] = {}
    while len(sessions) < 2:  # one session of each shard
        session = factories.session(agent=agent, owner=operator)
        sessions.setdefault(announce.shard_of(session.id), session)
    layer = get_channel_layer()
    channels = {shard: async_to_sync(layer.new_channel)() for shard in sessions}
    for shard, session in sessions.items():
        async_to_sync(layer.group_add)(announce.session_group(session.id), channels[shard])
    refused = subprocess.run([sys.executable, "manage.py", "announcer", "--shard", "2"], cwd=ROOT, capture_output=True,
                             env={**os.environ, "AGENTOPS_ANNOUNCERS": "2"}, timeout=60)
    assert refused.returncode != 0 and b"--shard must be from 0 to 1" in refused.stderr
    proc = _start_announcer("--shard", "1", shards=2)  # shard 0 has no announcer
    try:
        _wait_alive(proc, shard=1)
        assert announce.relay_alive() == {1}
        rendered_here = _rendered_here(monkeypatch)
        events = {shard: event_record(session_id=s.id, type="session.status_changed", payload={"status": "idle"})
                  for shard, s in sessions.items()}
        for shard, event in events.items():
            assert 'data-target="#session-status"' in _next_items(layer, channels[shard], event.seq)["html"]
        # Shard 0's event rendered here, by the writer; shard 1's by its announcer.
        assert [str(e["session_id"]) for e in rendered_here] == [str(sessions[0].id)]
        relayed = redis_client().xrange(announce.relay_stream(1))
        assert [json.loads(fields[b"e"])["session_id"] for _, fields in relayed] == [  # type: ignore[union-attr]
            str(sessions[1].id)]
        assert not redis_client().exists(announce.relay_stream(0))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for shard, session in sessions.items():
            async_to_sync(layer.group_discard)(announce.session_group(session.id), channels[shard])


def _relayed_of(session_id: Any) -> list[tuple[int, str]]:
    """(seq, type) of the relay stream's entries of one session, in stream order."""
    entries = redis_client().xrange(announce.RELAY_STREAM)
    events = [json.loads(fields[b"e"]) for _, fields in entries]  # type: ignore[union-attr]
    return [(e["seq"], e["type"]) for e in events if e["session_id"] == str(session_id)]


@pytest.fixture
def announcer_said_alive(clean_relay: None) -> None:
    """An announcer's heartbeat (no process: these tests read what the writers relay)."""
    redis_client().set(announce.relay_alive_key(0), "1", ex=60)


def test_a_writer_relays_only_the_events_someone_listens_to(
        announcer_said_alive: None, monkeypatch: pytest.MonkeyPatch, operator: Any, agent: Any) -> None:
    """Nobody watches most sessions most of the time: their events cost the writer one script run
    and no announcer any work (bench/concurrency.py N = 1,000, no watchers: the announcer's CPU
    went to the streams' reading and the listeners' checks). The check runs after the commit in the
    Redis that holds the groups, so a watcher that joins later reads the event from its backlog."""
    watched, quiet = (factories.session(agent=agent, owner=operator) for _ in range(2))
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(announce.session_group(watched.id), channel)
    rendered_here = _rendered_here(monkeypatch)
    try:
        with transaction.atomic():
            seqs = [event_record(session_id=s.id, type="note.added", payload={"n": n}).seq
                    for n, s in enumerate((quiet, watched, quiet, watched))]
        assert _relayed_of(watched.id) == [(seqs[1], "note.added"), (seqs[3], "note.added")]
        assert _relayed_of(quiet.id) == []
        assert rendered_here == []  # nor announced by the writer itself: nobody would receive it

        # An approval's event goes to its team's reviewers too: relayed when only they listen.
        reviewers = async_to_sync(layer.new_channel)()
        async_to_sync(layer.group_add)(announce.approvals_group(quiet.team_id), reviewers)
        try:
            asked = event_record(session_id=quiet.id, type="approval.requested", payload={"team_id": quiet.team_id})
            event_record(session_id=quiet.id, type="note.added", payload={})
            assert _relayed_of(quiet.id) == [(asked.seq, "approval.requested")]
        finally:
            async_to_sync(layer.group_discard)(announce.approvals_group(quiet.team_id), reviewers)

        # A watcher that joins now finds the earlier events in the database and gets the next live.
        late = async_to_sync(layer.new_channel)()
        async_to_sync(layer.group_add)(announce.session_group(quiet.id), late)
        try:
            after = event_record(session_id=quiet.id, type="note.added", payload={"late": True})
            assert _relayed_of(quiet.id)[-1] == (after.seq, "note.added")
        finally:
            async_to_sync(layer.group_discard)(announce.session_group(quiet.id), late)
    finally:
        async_to_sync(layer.group_discard)(announce.session_group(watched.id), channel)


def test_groups_in_another_redis_than_the_relay_get_every_event_relayed(
        announcer_said_alive: None, settings: Any, operator: Any, agent: Any) -> None:
    """The script reads the groups where it appends: with the channel layer on another Redis it
    cannot, and every event goes to the announcer, which asks the layer itself."""
    quiet = factories.session(agent=agent, owner=operator)
    settings.REDIS_URL = settings.REDIS_URL + "?elsewhere=1"  # the layer's host is no longer this URL
    event = event_record(session_id=quiet.id, type="note.added", payload={})
    assert _relayed_of(quiet.id) == [(event.seq, "note.added")]
