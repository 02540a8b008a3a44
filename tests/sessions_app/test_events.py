import asyncio
import uuid
from functools import partial
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from sessions_app import announce, selectors
from sessions_app.events import event_record
from sessions_app.models import Event
from tests import factories
from tests.concurrency import run_together
from tests.helpers import layer_receive


def _seqs(session_id: uuid.UUID) -> list[int]:
    return list(Event.objects.filter(session_id=session_id).order_by("seq").values_list("seq", flat=True))


@pytest.mark.django_db
def test_event_record_appends_consecutive_seq() -> None:
    session = factories.session()
    first = event_record(session_id=session.id, type="custom.one", payload={"a": 1})
    second = event_record(session_id=session.id, type="custom.two")
    assert second.seq == first.seq + 1
    assert _seqs(session.id) == list(range(1, second.seq + 1))


@pytest.mark.django_db
def test_events_after_reads_the_range_asked_for_with_any_page_size() -> None:
    """``selectors.events_after`` (compiled once per page size) reads ``after < seq <= until``, in
    seq order, at most ``limit``: the same the second time (through the compiled SQL), for another
    session none of this one's, and for page sizes past the few it compiles."""
    session, other = factories.session(), factories.session()
    base = max(_seqs(session.id), default=0)  # what the factory stored first
    for n in range(12):
        event_record(session_id=session.id, type="custom.n", payload={"n": n})
    event_record(session_id=other.id, type="custom.other")

    def seqs(**kwargs: Any) -> list[int]:
        return [e.seq - base for e in selectors.events_after(**kwargs)]

    for _ in range(2):
        assert seqs(session_id=session.id, after=base + 3) == list(range(4, 13))
        assert seqs(session_id=str(session.id), after=base + 3, until=base + 6) == [4, 5, 6]
        assert seqs(session_id=session.id, after=base, limit=5) == [1, 2, 3, 4, 5]
        assert all(e.session_id == other.id for e in selectors.events_after(session_id=other.id))
    for limit in range(1, selectors.PREPARED_LIMITS + 4):
        assert len(selectors.events_after(session_id=session.id, after=base, limit=limit)) == min(limit, 12)
    assert selectors.events_after(session_id=session.id, after=base + 12) == []
    assert selectors.events_after(session_id=uuid.uuid4()) == []


@pytest.mark.django_db
def test_event_record_rolled_back_with_caller_leaves_no_gap() -> None:
    session = factories.session()
    before = _seqs(session.id)
    with pytest.raises(RuntimeError), transaction.atomic():
        event_record(session_id=session.id, type="custom.lost")
        raise RuntimeError("caller failed")
    after = event_record(session_id=session.id, type="custom.kept")
    assert after.seq == len(before) + 1
    assert _seqs(session.id) == list(range(1, after.seq + 1))


@pytest.mark.django_db
def test_event_record_unknown_session_is_not_found() -> None:
    from agentops.domain import NotFound

    with pytest.raises(NotFound):
        event_record(session_id=uuid.uuid4(), type="custom.x")


@pytest.mark.django_db(transaction=True)
def test_event_record_concurrent_writers_gap_free() -> None:
    session = factories.session()
    start = _seqs(session.id)
    threads_n, per_thread = 8, 25

    def writer(k: int) -> None:
        for i in range(per_thread):
            with transaction.atomic():
                event_record(session_id=session.id, type="custom.concurrent", payload={"t": k, "i": i})

    errors = [r for r in run_together([partial(writer, k) for k in range(threads_n)]) if r is not None]
    assert errors == []
    seqs = _seqs(session.id)
    expected = len(start) + threads_n * per_thread
    print(f"\n{threads_n} threads x {per_thread} events: {len(seqs)} events, max seq {max(seqs)}, "
          f"gaps {sorted(set(range(1, max(seqs) + 1)) - set(seqs))}")
    assert seqs == list(range(1, expected + 1))


def _received(layer: Any, channel: str, seq: int) -> dict[str, Any]:
    """The announcement of event ``seq`` on ``channel``: the session's earlier events (its
    ``session.created``, announced by the announcer thread whenever it gets to it) may come first."""
    while True:
        items = announce.unbatch(async_to_sync(asyncio.wait_for)(layer.receive(channel), 10))
        assert all(item["event"]["seq"] <= seq for item in items), items
        for item in items:
            if item["event"]["seq"] == seq:
                return item


@pytest.mark.django_db(transaction=True)
def test_event_record_announces_after_commit_on_session_and_approvals_groups() -> None:
    session = factories.session()
    layer = get_channel_layer()
    session_channel = async_to_sync(layer.new_channel)()
    approvals_channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(announce.session_group(session.id), session_channel)
    async_to_sync(layer.group_add)(announce.approvals_group(session.team_id), approvals_channel)
    try:
        with transaction.atomic():
            event = event_record(session_id=session.id, type="approval.requested",
                                 payload={"tool": "x", "team_id": session.team_id})
        got = _received(layer, session_channel, event.seq)
        assert got["event"]["seq"] == event.seq
        assert got["event"]["type"] == "approval.requested"
        assert got["event"]["payload"] == {"tool": "x", "team_id": session.team_id}
        got_approvals = _received(layer, approvals_channel, event.seq)
        assert got_approvals["event"]["seq"] == event.seq
    finally:
        async_to_sync(layer.group_discard)(announce.session_group(session.id), session_channel)
        async_to_sync(layer.group_discard)(announce.approvals_group(session.team_id), approvals_channel)


def test_an_announcement_sends_one_message_per_listened_group_and_renders_for_no_one_else(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Sessions no other announcement can reach (the announcer thread sends what event_record stores).
    watched, single, unwatched = (uuid.uuid4() for _ in range(3))
    events = [{"seq": n + 1, "type": "note.added", "session_id": str(s), "payload": {"n": n}}
              for n, s in enumerate([watched, unwatched, watched, single, watched])]
    rendered: list[int] = []

    def render(evs: list[dict[str, Any]]) -> list[str]:
        rendered.extend(e["payload"]["n"] for e in evs)
        return [f"<p>{e['payload']['n']}</p>" for e in evs]

    monkeypatch.setattr(announce, "fragments_renderer", render)
    layer = get_channel_layer()
    channels = {s: async_to_sync(layer.new_channel)() for s in (watched, single)}
    for session_id, channel in channels.items():
        async_to_sync(layer.group_add)(announce.session_group(session_id), channel)
    try:
        assert announce._send(events, only_listened=True) is True
        batch = layer_receive(layer, channels[watched])
        assert batch["type"] == "event.batch"
        assert [(i["event"]["payload"]["n"], i["html"]) for i in announce.unbatch(batch)] == [
            (0, "<p>0</p>"), (2, "<p>2</p>"), (4, "<p>4</p>")]
        one = layer_receive(layer, channels[single])
        assert (one["type"], one["event"]["payload"], announce.unbatch(one)) == ("event.message", {"n": 3}, [one])
        assert rendered == [0, 2, 3, 4]  # the unwatched session's event: neither rendered nor sent
        assert all(isinstance(i["announced_at"], float) for i in [*announce.unbatch(batch), one])
    finally:
        for session_id, channel in channels.items():
            async_to_sync(layer.group_discard)(announce.session_group(session_id), channel)


@pytest.mark.django_db(transaction=True)
def test_event_record_survives_redis_down(settings) -> None:  # type: ignore[no-untyped-def]
    session = factories.session()
    from channels.layers import channel_layers

    # A Redis that does not answer: the write must still succeed and the event be stored.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}}
    channel_layers.backends.clear()
    try:
        with transaction.atomic():
            event = event_record(session_id=session.id, type="custom.while_redis_down")
        assert Event.objects.filter(pk=event.pk).exists()
        assert announce.announce_event(event.as_dict()) is False
    finally:
        channel_layers.backends.clear()


# --- step_outcome_record: one outcome of a turn in one write ---------------------------------

@pytest.mark.django_db(transaction=True)
def test_step_outcome_record_appends_events_counters_and_steps_together() -> None:
    from sessions_app.engine.record import StepChange, step_outcome_record
    from sessions_app.models import AgentSession, Step, Turn

    session = factories.session()
    turn = factories.turn(session)
    running = factories.step(turn, kind="model", tool_name="", index=0)
    Step.objects.filter(pk=running.pk).update(status="running")
    before = event_record(session_id=session.id, type="custom.before").seq
    new = Step(session_id=session.id, turn_id=turn.id, index=1, kind="tool", tool_name="list_files",
               status="completed", result={"output": "a.txt"})
    with transaction.atomic():
        counters = step_outcome_record(
            session_id=session.id, turn_id=turn.id,
            events=[("model.completed", running.id, {"n": 1}), ("tool.completed", new.id, {"n": 2})],
            step_changes=[StepChange(running.id, "running", "completed", {"message": {"role": "x"}})],
            step_inserts=[new], model_calls=1, tool_calls=1, prompt_tokens=30, completion_tokens=4)
    assert counters is not None
    assert counters["steps_changed"] == 1
    assert (counters["model_calls"], counters["tool_calls"], counters["prompt_tokens"]) == (1, 1, 30)
    events = list(Event.objects.filter(session_id=session.id, seq__gt=before).order_by("seq"))
    assert [(e.seq, e.type, e.step_id, e.turn_id, e.payload) for e in events] == [
        (before + 1, "model.completed", running.id, turn.id, {"n": 1}),
        (before + 2, "tool.completed", new.id, turn.id, {"n": 2})]
    assert _seqs(session.id) == list(range(1, before + 3))
    assert Step.objects.get(pk=running.pk).status == "completed"
    assert Step.objects.get(pk=running.pk).message == {"role": "x"}
    assert Step.objects.get(pk=new.pk).result == {"output": "a.txt"}
    row = AgentSession.objects.get(pk=session.pk)
    assert (row.model_calls, row.tool_calls, row.prompt_tokens, row.completion_tokens, row.last_seq) == (
        1, 1, 30, 4, before + 2)
    assert Turn.objects.values_list("prompt_tokens", "completion_tokens").get(pk=turn.pk) == (30, 4)


@pytest.mark.django_db(transaction=True)
def test_step_outcome_record_stores_a_new_step_as_the_orm_would() -> None:
    """The PostgreSQL write sends new steps as one JSON parameter (jsonb_populate_recordset): every
    column must come back as a save through the ORM stores it: a missing JSON value NULL (not JSON
    null), times to the microsecond, ids, nested JSON, the auto_now stamps."""
    from datetime import timedelta

    from django.utils import timezone

    from sessions_app.engine.record import step_outcome_record
    from sessions_app.models import Step

    session = factories.session()
    turn = factories.turn(session)
    lease = timezone.now().replace(microsecond=123456) + timedelta(minutes=1)

    def step(index: int) -> Step:
        return Step(session_id=session.id, turn_id=turn.id, index=index, kind="tool", status="completed",
                    tool_name="list_files", call_id=f"call-{index}", arguments={"path": ".", "deep": [1, {"x": None}]},
                    approval_mode="safe_readonly", result={"status": "completed", "output": "é\n"}, attempts=1,
                    idempotency_key=f"{turn.id}:call-{index}", lease_owner="w", lease_expires_at=lease,
                    started_at=lease, finished_at=lease)

    step(1).save(force_insert=True)
    with transaction.atomic():
        step_outcome_record(session_id=session.id, turn_id=turn.id, events=[], step_inserts=[step(2)])
    fields = [f.attname for f in Step._meta.concrete_fields if f.attname not in (
        "id", "index", "call_id", "idempotency_key", "created_at", "updated_at")]
    orm, written = (Step.objects.filter(turn=turn, index=i).values(*fields, "created_at", "updated_at").get()
                    for i in (1, 2))
    assert {f: written[f] for f in fields} == {f: orm[f] for f in fields}
    assert written["checks"] is None and written["manifest"] is None  # SQL NULL, not JSON null
    assert Step.objects.filter(turn=turn, index=2, checks__isnull=True, manifest__isnull=True).exists()
    assert written["created_at"] is not None and written["updated_at"] is not None


@pytest.mark.django_db(transaction=True)
def test_step_outcome_record_step_change_applies_only_from_its_status() -> None:
    from sessions_app.engine.record import StepChange, step_outcome_record
    from sessions_app.models import Step

    session = factories.session()
    turn = factories.turn(session)
    step = factories.step(turn, kind="model", tool_name="", index=0)
    Step.objects.filter(pk=step.pk).update(status="cancelled")
    with transaction.atomic():
        counters = step_outcome_record(session_id=session.id, turn_id=turn.id,
                                       events=[("model.completed", step.id, {})],
                                       step_changes=[StepChange(step.id, "running", "completed", {})])
        assert counters is not None and counters["steps_changed"] == 0
        transaction.set_rollback(True)  # what the engine does when its step moved meanwhile
    assert Step.objects.get(pk=step.pk).status == "cancelled"
    assert not Event.objects.filter(session_id=session.id, type="model.completed").exists()


@pytest.mark.django_db(transaction=True)
def test_step_outcome_record_unknown_turn_or_session_changes_nothing() -> None:
    from agentops.domain import NotFound
    from sessions_app.engine.record import step_outcome_record
    from sessions_app.models import AgentSession

    session = factories.session()
    other_turn = factories.turn(factories.session())
    last = AgentSession.objects.get(pk=session.pk).last_seq
    with pytest.raises(NotFound), transaction.atomic():
        step_outcome_record(session_id=session.id, turn_id=other_turn.id, events=[("custom.x", None, {})], tool_calls=1)
    row = AgentSession.objects.get(pk=session.pk)
    assert (row.last_seq, row.tool_calls) == (last, 0)
    assert _seqs(session.id) == list(range(1, last + 1))
    with transaction.atomic():
        assert step_outcome_record(session_id=uuid.uuid4(), turn_id=other_turn.id,
                                   events=[("custom.x", None, {})]) is None


@pytest.mark.django_db(transaction=True)
def test_step_outcome_record_and_event_record_concurrent_writers_gap_free() -> None:
    from sessions_app.engine.record import step_outcome_record
    from sessions_app.models import AgentSession

    session = factories.session()
    turn = factories.turn(session)
    start = _seqs(session.id)
    threads_n, per_thread = 6, 20

    def writer(k: int) -> None:
        for i in range(per_thread):
            with transaction.atomic():
                if k % 2:
                    step_outcome_record(session_id=session.id, turn_id=turn.id, tool_calls=1,
                                   events=[("custom.a", None, {"t": k, "i": i}), ("custom.b", None, {})])
                else:
                    event_record(session_id=session.id, type="custom.one", payload={"t": k, "i": i})

    errors = [r for r in run_together([partial(writer, k) for k in range(threads_n)]) if r is not None]
    assert errors == []
    writers_of_two = threads_n // 2
    expected = len(start) + per_thread * (writers_of_two * 2 + (threads_n - writers_of_two))
    assert _seqs(session.id) == list(range(1, expected + 1))
    assert AgentSession.objects.get(pk=session.pk).tool_calls == writers_of_two * per_thread


def test_a_session_found_unwatched_is_checked_again_so_a_new_client_misses_nothing() -> None:
    session_id = uuid.uuid4()
    event = {"seq": 1, "type": "note.added", "session_id": str(session_id), "payload": {}}
    layer = get_channel_layer()
    group = announce.session_group(session_id)
    assert announce._send([event], only_listened=True) is True  # nobody listens: nothing sent
    assert group not in announce._listened_until
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    try:
        assert announce._send([{**event, "seq": 2}], only_listened=True) is True
        assert layer_receive(layer, channel)["event"]["seq"] == 2
        assert group in announce._listened_until  # watched: not asked again for a while
        assert announce._send([{**event, "seq": 3}], only_listened=True) is True
        assert layer_receive(layer, channel)["event"]["seq"] == 3
    finally:
        async_to_sync(layer.group_discard)(group, channel)
