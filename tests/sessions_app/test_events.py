import threading
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection, transaction

from sessions_app import announce
from sessions_app.models import Event
from sessions_app.services import event_record
from tests import factories
from tests.conftest import requires_postgres


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


@requires_postgres()
@pytest.mark.django_db(transaction=True)
def test_event_record_concurrent_writers_gap_free() -> None:
    session = factories.session()
    start = _seqs(session.id)
    threads_n, per_thread = 8, 25
    barrier = threading.Barrier(threads_n)
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                with transaction.atomic():
                    event_record(session_id=session.id, type="custom.concurrent", payload={"t": k, "i": i})
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    seqs = _seqs(session.id)
    expected = len(start) + threads_n * per_thread
    print(f"\n{threads_n} threads x {per_thread} events: {len(seqs)} events, max seq {max(seqs)}, "
          f"gaps {sorted(set(range(1, max(seqs) + 1)) - set(seqs))}")
    assert seqs == list(range(1, expected + 1))


@pytest.mark.django_db(transaction=True)
def test_event_record_announces_after_commit_on_session_and_approvals_groups() -> None:
    session = factories.session()
    layer = get_channel_layer()
    session_channel = async_to_sync(layer.new_channel)()
    approvals_channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(announce.session_group(session.id), session_channel)
    async_to_sync(layer.group_add)(announce.APPROVALS_GROUP, approvals_channel)
    try:
        with transaction.atomic():
            event = event_record(session_id=session.id, type="approval.requested", payload={"tool": "x"})
        got = async_to_sync(layer.receive)(session_channel)
        assert got["event"]["seq"] == event.seq
        assert got["event"]["type"] == "approval.requested"
        assert got["event"]["payload"] == {"tool": "x"}
        got_approvals = async_to_sync(layer.receive)(approvals_channel)
        assert got_approvals["event"]["seq"] == event.seq
    finally:
        async_to_sync(layer.group_discard)(announce.session_group(session.id), session_channel)
        async_to_sync(layer.group_discard)(announce.APPROVALS_GROUP, approvals_channel)


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
