"""Webhooks: a real local HTTP receiver verifies the HMAC signature and timestamp, answers 500
first and 200 next; a real Celery worker (on the notify queue) delivers from the outbox and
retries with backoff; the delivery log keeps both attempts; a replay sends the same delivery id
again. A dripping receiver is cut off at the attempt's total deadline, and holds neither the outbox
sweep nor the deliveries behind it."""

import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.utils import timezone

from agentops import dispatch
from notify_app.models import Delivery, DeliveryAttempt, WebhookEndpoint
from notify_app.services import NOTIFY_QUEUE, delivery_replay, delivery_send, notify_backlog, outbox_sweep
from notify_app.signing import signature_header, signature_verify
from tests import factories
from tests.approvals_app.review_helpers import pending, policy
from tests.notify_app.drip import DripReceiver
from tests.waiting import wait_for

SECRET = "whsec-test-0123456789"


class Receiver:
    """Records each POST; answers the statuses in ``plan`` in turn (then 200)."""

    def __init__(self, plan: list[int]) -> None:
        self.plan, self.calls = list(plan), []  # type: ignore[var-annotated]
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                valid = signature_verify(secret=SECRET, header=self.headers.get("X-Agentops-Signature", ""), body=body)
                receiver.calls.append({"valid": valid, "body": json.loads(body), "headers": dict(self.headers)})
                status = receiver.plan.pop(0) if receiver.plan else 200
                self.send_response(status if valid else 401)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"boom")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver([500])
    yield r
    r.server.shutdown()


def test_signature_verification_refuses_tampering_and_old_timestamps() -> None:
    body = b'{"a":1}'
    header = signature_header(secret=SECRET, body=body, timestamp=1_000_000)
    assert signature_verify(secret=SECRET, header=header, body=body, now=1_000_100)
    assert not signature_verify(secret=SECRET, header=header, body=b'{"a":2}', now=1_000_100)
    assert not signature_verify(secret="other", header=header, body=body, now=1_000_100)
    assert not signature_verify(secret=SECRET, header=header, body=body, now=1_000_000 + 301)  # a replay, later
    assert not signature_verify(secret=SECRET, header="garbage", body=body)


@pytest.mark.usefixtures("notify_worker")
def test_webhook_is_signed_retried_after_500_and_logged(receiver: Receiver, settings: Any) -> None:
    settings.AGENTOPS_NOTIFY_BACKOFF_SECONDS = 0.5
    team = factories.team()
    endpoint = WebhookEndpoint.objects.create(team=team, name="ops", url=receiver.url, secret=SECRET,
                                              events=["approval.requested"])
    WebhookEndpoint.objects.create(team=factories.team("elsewhere"), name="x", url=receiver.url, secret="s")
    policy(team=team, tool_name="run_command", required_approvals=2)
    approval = pending(arguments={"command": "deploy", "env": {"API_KEY": "sk-live-123", "region": "eu"}})
    delivery = Delivery.objects.get(endpoint=endpoint)
    wait_for(lambda: Delivery.objects.get(pk=delivery.pk).status == "delivered", timeout=60, what="delivery")
    assert [c["valid"] for c in receiver.calls] == [True, True]
    first, second = receiver.calls
    assert first["headers"]["X-Agentops-Delivery"] == second["headers"]["X-Agentops-Delivery"] == str(
        delivery.delivery_id)
    body = second["body"]
    assert (body["event"], body["request_id"], body["required_approvals"]) == (
        "approval.requested", str(approval.request_id), 2)
    assert body["arguments"]["env"] == {"API_KEY": "[redacted]", "region": "eu"}
    assert "sk-live-123" not in json.dumps(receiver.calls)
    log = list(DeliveryAttempt.objects.filter(delivery=delivery).values_list("attempt", "status_code", "ok"))
    assert log == [(1, 500, False), (2, 200, True)]
    # a replay from the admin sends it again, same delivery id (receivers dedupe)
    delivery_replay(delivery_pk=delivery.pk)
    wait_for(lambda: len(receiver.calls) == 3, timeout=30, what="the replay")
    assert receiver.calls[2]["headers"]["X-Agentops-Delivery"] == str(delivery.delivery_id)


@pytest.mark.django_db
def test_a_delivery_gives_up_after_the_last_attempt(settings: Any) -> None:
    settings.AGENTOPS_NOTIFY_MAX_ATTEMPTS = 2
    settings.AGENTOPS_NOTIFY_BACKOFF_SECONDS = 0
    r = Receiver([500, 503])
    try:
        team = factories.team()
        WebhookEndpoint.objects.create(team=team, name="ops", url=r.url, secret=SECRET)
        policy(team=team, tool_name="run_command", omit_arguments=True)
        pending()
        delivery = Delivery.objects.get(channel="webhook")
        assert delivery_send(delivery_pk=delivery.pk).status == "pending"  # type: ignore[union-attr]
        assert delivery_send(delivery_pk=delivery.pk).status == "dead"  # type: ignore[union-attr]
        assert delivery_send(delivery_pk=delivery.pk) is None  # nothing due
        assert "arguments" not in r.calls[0]["body"] and r.calls[0]["body"]["arguments_omitted"] is True
    finally:
        r.server.shutdown()


@pytest.mark.django_db
def test_delivery_send_ends_a_dripping_answer_at_its_total_deadline(settings: Any) -> None:
    """A receiver that answers 200 and then one byte every 0.3 s held the sender for as long as it
    dripped (httpx's timeout is per read; this one gives up after 20 s): the total deadline ends the
    attempt, which counts as failed and is retried with the usual backoff."""
    settings.AGENTOPS_NOTIFY_TIMEOUT_SECONDS = 2
    settings.AGENTOPS_NOTIFY_BACKOFF_SECONDS = 30
    drip = DripReceiver(interval=0.3, give_up_after=20)
    try:
        WebhookEndpoint.objects.create(team=factories.team(), name="slow", url=drip.url, secret=SECRET)
        pending()
        delivery = Delivery.objects.get(channel="webhook")
        started = time.monotonic()
        row = delivery_send(delivery_pk=delivery.pk)
        elapsed = time.monotonic() - started
    finally:
        drip.close()
    assert elapsed < 4, f"the attempt took {elapsed:.1f} s"
    assert row is not None and (row.status, row.attempts) == ("pending", 1)
    assert row.last_error.startswith("deadline: no complete answer within 2 s")
    (attempt,) = DeliveryAttempt.objects.filter(delivery=delivery)
    assert (attempt.ok, attempt.status_code) == (False, None) and 1900 <= attempt.duration_ms < 4000
    assert 25 <= (row.next_attempt_at - timezone.now()).total_seconds() <= 30  # backoff, as for any failure
    assert drip.deliveries == [str(delivery.delivery_id)]


def _lost(endpoint: WebhookEndpoint, *, age: float) -> Delivery:
    """An outbox row due ``age`` seconds ago whose task was lost: only the sweep sends it."""
    return Delivery.objects.create(channel="webhook", team=endpoint.team, endpoint=endpoint,
                                   event_type="approval.requested", request_id=uuid.uuid4(),
                                   payload={"event": "approval.requested"},
                                   next_attempt_at=timezone.now() - timedelta(seconds=age))


@pytest.mark.usefixtures("notify_worker")
def test_outbox_sweep_hands_each_due_delivery_to_a_task_of_its_own(settings: Any) -> None:
    """The sweep sent the due deliveries one after another in its own task: two to a dripping
    receiver, the oldest, held it 2 × 10 s before the first to a working one. Now it enqueues each
    and returns at once; the real worker delivers the good ones while the slow ones are in flight."""
    settings.AGENTOPS_NOTIFY_TIMEOUT_SECONDS = 10
    drip, good = DripReceiver(give_up_after=60), Receiver([])
    try:
        team = factories.team()
        slow_end = WebhookEndpoint.objects.create(team=team, name="slow", url=drip.url, secret=SECRET)
        good_end = WebhookEndpoint.objects.create(team=team, name="good", url=good.url, secret=SECRET)
        slow = [_lost(slow_end, age=60 - n).pk for n in range(2)]
        fast = [_lost(good_end, age=30 - n).pk for n in range(3)]
        started = time.monotonic()
        assert outbox_sweep() == 5
        assert time.monotonic() - started < 2, f"the sweep took {time.monotonic() - started:.1f} s"
        wait_for(lambda: Delivery.objects.filter(pk__in=fast, status="delivered").count() == 3, 5,
                 "the deliveries to the working receiver")
        assert Delivery.objects.filter(pk__in=slow, status="pending", attempts=1).count() == 2
        assert drip.open == 2 and len(good.calls) == 3
        assert outbox_sweep() == 0  # the slow ones are claimed, in flight; the others delivered
    finally:
        drip.close()
        good.server.shutdown()


@pytest.mark.django_db
def test_outbox_sweep_adds_nothing_while_the_notify_queue_is_deep() -> None:
    """With no worker taking them, a sweep every few seconds would queue the same due rows again and
    again: it fills the queue up to its limit, no further."""
    client = dispatch.redis_client()
    client.delete(NOTIFY_QUEUE)  # what earlier tests left there
    try:
        endpoint = WebhookEndpoint.objects.create(team=factories.team(), name="x", url="http://127.0.0.1:9/",
                                                  secret=SECRET)
        for n in range(5):
            _lost(endpoint, age=n)
        assert outbox_sweep(limit=3) == 3 and notify_backlog() == 3
        assert outbox_sweep(limit=3) == 0 and notify_backlog() == 3
        assert outbox_sweep(limit=4) == 1 and notify_backlog() == 4
    finally:
        client.delete(NOTIFY_QUEUE)
