"""Notifications: written to the outbox in the transaction of the change they report, sent by a
task (at least once; receivers dedupe on ``X-Agentops-Delivery``), retried with exponential
backoff, logged per attempt, replayable from the admin.

A notification never carries a secret value: arguments pass through ``redact`` (values of keys
that name secrets are replaced), and a policy with ``omit_arguments`` leaves them out entirely.
"""

import json
import logging
import re
import time
import uuid
from datetime import datetime, timedelta
from typing import Any, cast

import httpx
import redis
from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from kombu.exceptions import OperationalError

from agentops import dispatch
from agentops.celery import app
from agentops.deadline import Deadline, send_within
from agentops.domain import Conflict, NotFound, PermissionDenied, canonical_json
from approvals_app.models import ApprovalRequest
from notify_app.models import NOTIFY_EVENTS, Delivery, DeliveryAttempt, LinkUse, WebhookEndpoint
from notify_app.selectors import eligible_reviewers, escalation_recipients
from notify_app.signing import link_load, link_token, signature_header

log = logging.getLogger(__name__)
SEND_TASK = "notify_app.tasks.delivery_send_task"
NOTIFY_QUEUE = "notify"  # where settings.CELERY_TASK_ROUTES send the deliveries and the sweep
WEBHOOK_ANSWER_CAP = 64 * 1024  # of a receiver's answer, read at most this much (the log keeps 500 characters)
SECRET_KEY_RE = re.compile(r"(secret|password|passwd|token|api[_-]?key|authorization|credential|private)", re.I)
EMAIL_EVENTS = {"approval.requested": "waits for your review", "approval.escalated": "was escalated (expires soon)",
                "approval.decided": "was decided"}


def redact(value: Any) -> Any:
    """The value with every entry under a secret-looking key replaced by ``[redacted]``."""
    if isinstance(value, dict):
        return {k: "[redacted]" if isinstance(k, str) and SECRET_KEY_RE.search(k) else redact(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def notification_payload(approval: ApprovalRequest, event_type: str) -> dict[str, Any]:
    """What any notification says about a request (never a secret value)."""
    doc: dict[str, Any] = {
        "event": event_type, "request_id": str(approval.request_id), "team_id": approval.team_id,
        "session_id": str(approval.session_id), "tool": approval.tool_name, "status": approval.status,
        "decision": approval.decision or None, "risk": approval.risk, "priority": approval.priority,
        "required_approvals": approval.required_approvals, "policy": approval.policy_reason or None,
        "arguments_sha256": approval.arguments_sha256,
        "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
        "url": settings.AGENTOPS_PUBLIC_URL.rstrip("/") + reverse("approval_detail", args=[approval.request_id]),
    }
    if approval.omit_arguments:
        doc["arguments_omitted"] = True
    else:
        doc["arguments"] = redact(approval.arguments)
    return doc


def _enqueue_after_commit(ids: list[int]) -> None:
    def send() -> None:
        for pk in ids:
            try:
                app.send_task(SEND_TASK, args=[pk])
            except Exception:  # the broker is down: the outbox sweep sends it
                log.warning("could not enqueue delivery %s; the outbox sweep will", pk)
    if ids:
        transaction.on_commit(send)


def notifications_enqueue(*, approval: ApprovalRequest, what: str) -> list[Delivery]:
    """Outbox rows for one change of a request (call inside the change's transaction)."""
    event_type = f"approval.{what}"
    if event_type not in NOTIFY_EVENTS:
        return []
    now = timezone.now()
    payload = notification_payload(approval, event_type)
    rows = [Delivery(channel=Delivery.Channel.WEBHOOK, team_id=approval.team_id, endpoint=endpoint,
                     event_type=event_type, request_id=approval.request_id, payload=payload, next_attempt_at=now)
            for endpoint in WebhookEndpoint.objects.filter(team_id=approval.team_id, enabled=True)
            if not endpoint.events or event_type in endpoint.events]
    if event_type in EMAIL_EVENTS:
        people = escalation_recipients(approval) if what == "escalated" else eligible_reviewers(approval)
        rows += [Delivery(channel=Delivery.Channel.EMAIL, team_id=approval.team_id, recipient=person,
                          event_type=event_type, request_id=approval.request_id, payload=payload,
                          next_attempt_at=now) for person in people]
    created = Delivery.objects.bulk_create(rows)
    _enqueue_after_commit([d.pk for d in created])
    return created


def backoff_seconds(attempts: int) -> float:
    """After the ``attempts``-th failure: base × 2^(attempts-1), capped."""
    base = settings.AGENTOPS_NOTIFY_BACKOFF_SECONDS
    return float(min(base * (2 ** max(attempts - 1, 0)), settings.AGENTOPS_NOTIFY_BACKOFF_MAX_SECONDS))


@transaction.atomic
def _claim(delivery_pk: int, now: datetime) -> Delivery | None:
    """Take a due delivery: its next attempt moves a lease ahead, so a concurrent sender skips it
    (twice the send's total deadline: the send is over before the lease is)."""
    delivery = (Delivery.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("endpoint", "recipient")
                .filter(pk=delivery_pk, status=Delivery.Status.PENDING, next_attempt_at__lte=now).first())
    if delivery is None:
        return None
    delivery.attempts += 1
    delivery.next_attempt_at = now + timedelta(seconds=settings.AGENTOPS_NOTIFY_TIMEOUT_SECONDS * 2)
    delivery.save(update_fields=["attempts", "next_attempt_at", "updated_at"])
    return delivery


def _send_webhook(delivery: Delivery) -> tuple[bool, int | None, str]:
    endpoint = delivery.endpoint
    assert endpoint is not None
    body = canonical_json({**delivery.payload, "delivery_id": str(delivery.delivery_id)}).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "agentops-webhooks/1",
               "X-Agentops-Event": delivery.event_type, "X-Agentops-Delivery": str(delivery.delivery_id),
               "X-Agentops-Signature": signature_header(secret=endpoint.secret, body=body)}
    # One total deadline for the whole exchange: a receiver that answers a byte at a time held a
    # worker thread for as long as it kept dripping (httpx's timeout is per read).
    seconds = settings.AGENTOPS_NOTIFY_TIMEOUT_SECONDS
    deadline = Deadline(seconds)
    try:
        with httpx.Client(follow_redirects=False, timeout=deadline.remaining()) as client:
            request = client.build_request("POST", endpoint.url, content=body, headers=headers)
            response, received = send_within(client, request, deadline, cap=WEBHOOK_ANSWER_CAP)
    except httpx.HTTPError as exc:
        if deadline.expired:
            return False, None, f"deadline: no complete answer within {seconds:g} s (connect, send and response)"
        return False, None, f"{type(exc).__name__}: {exc}"[:500]
    finally:
        deadline.cancel()
    ok = 200 <= response.status_code < 300
    return ok, response.status_code, "" if ok else received.decode(response.encoding or "utf-8", "replace")[:500]


def _send_email(delivery: Delivery) -> tuple[bool, int | None, str]:
    person = delivery.recipient
    assert person is not None
    payload = delivery.payload
    link = settings.AGENTOPS_PUBLIC_URL.rstrip("/") + reverse(
        "notify_link", args=[link_token(request_id=uuid.UUID(payload["request_id"]), user_id=person.pk)])
    context = {"p": payload, "person": person, "link": link, "what": EMAIL_EVENTS.get(delivery.event_type, ""),
               "arguments": json.dumps(payload["arguments"], indent=2, sort_keys=True)
               if "arguments" in payload else None}
    subject = f"[agentops] {payload['tool']} {context['what']} ({payload['risk']} risk)"
    try:
        send_mail(subject, render_to_string("notify/approval_email.txt", context), None, [person.email])
    except OSError as exc:  # SMTP refused or unreachable: retried
        return False, None, f"{type(exc).__name__}: {exc}"[:500]
    return True, None, ""


def delivery_send(*, delivery_pk: int, now: datetime | None = None) -> Delivery | None:
    """Attempt one due delivery (claim, send outside any transaction, record). None when it is
    not due or another sender has it. A failure schedules the next attempt with backoff, or gives
    up after AGENTOPS_NOTIFY_MAX_ATTEMPTS."""
    delivery = _claim(delivery_pk, now or timezone.now())
    if delivery is None:
        return None
    started = time.monotonic()
    sender = _send_webhook if delivery.channel == Delivery.Channel.WEBHOOK else _send_email
    ok, code, error = sender(delivery)
    duration = int((time.monotonic() - started) * 1000)
    with transaction.atomic():
        row = Delivery.objects.select_for_update().get(pk=delivery.pk)
        DeliveryAttempt.objects.create(delivery=row, attempt=row.attempts, ok=ok, status_code=code, error=error,
                                       duration_ms=duration)
        if ok:
            row.ensure_can_move_to(Delivery.Status.DELIVERED)
            row.status, row.delivered_at, row.last_error = Delivery.Status.DELIVERED, timezone.now(), ""
        elif row.attempts >= settings.AGENTOPS_NOTIFY_MAX_ATTEMPTS:
            row.ensure_can_move_to(Delivery.Status.DEAD)
            row.status, row.last_error = Delivery.Status.DEAD, error or f"HTTP {code}"
        else:
            delay = backoff_seconds(row.attempts)
            row.next_attempt_at, row.last_error = timezone.now() + timedelta(seconds=delay), error or f"HTTP {code}"
            transaction.on_commit(lambda: _retry_later(row.pk, delay))
        row.save(update_fields=["status", "delivered_at", "last_error", "next_attempt_at", "updated_at"])
    return row


def _retry_later(pk: int, delay: float) -> None:
    try:
        app.send_task(SEND_TASK, args=[pk], countdown=delay)
    except Exception:
        log.warning("could not schedule the retry of delivery %s; the outbox sweep will", pk)


def notify_backlog() -> int:
    """Tasks waiting in the notify queue (the Redis list kombu keeps for it)."""
    return cast(int, dispatch.redis_client().llen(NOTIFY_QUEUE))


def outbox_sweep(*, now: datetime | None = None, limit: int = 200) -> int:
    """Hand each due delivery (its task was lost, or its retry came due) to a task of its own, the
    oldest first; how many were handed over. Sent here one after another, a slow receiver held the
    sweep, and every delivery behind it, for up to ``limit`` deadlines. While the queue holds
    ``limit`` tasks or more the workers are behind, not missing tasks: none are added (each sweep
    would add the same rows again)."""
    now = now or timezone.now()
    try:
        room = limit - notify_backlog()
    except redis.RedisError:
        log.warning("outbox sweep: Redis is unreachable; nothing enqueued this time")
        return 0
    if room <= 0:
        return 0
    due = list(Delivery.objects.filter(status=Delivery.Status.PENDING, next_attempt_at__lte=now)
               .order_by("next_attempt_at").values_list("pk", flat=True)[:room])
    for n, pk in enumerate(due):
        try:
            app.send_task(SEND_TASK, args=[pk])
        except (OperationalError, redis.RedisError, OSError):
            log.warning("outbox sweep: could not enqueue delivery %s; the next sweep will", pk)
            return n
    return len(due)


@transaction.atomic
def delivery_replay(*, delivery_pk: int) -> Delivery:
    """Send a delivered or dead delivery again (same delivery id: receivers can dedupe)."""
    row = Delivery.objects.select_for_update().get(pk=delivery_pk)
    if row.status == Delivery.Status.PENDING:
        raise Conflict("This delivery is still pending.", code="delivery_pending")
    row.ensure_can_move_to(Delivery.Status.PENDING)
    row.status, row.next_attempt_at, row.attempts = Delivery.Status.PENDING, timezone.now(), 0
    row.save(update_fields=["status", "next_attempt_at", "attempts", "updated_at"])
    _enqueue_after_commit([row.pk])
    return row


class LinkUsed(Conflict):
    """This link was opened already; open the request from the queue."""

    code = "link_used"
    status = 410


def link_redeem(*, token: str, user: Any) -> uuid.UUID:
    """The request a one-time email link opens, for the user it was sent to. Raises NotFound for a
    forged or expired token, PermissionDenied for another user, LinkUsed on a second open."""
    data = link_load(token, max_age_seconds=settings.AGENTOPS_NOTIFY_LINK_SECONDS)
    if data is None:
        raise NotFound("This link is invalid or has expired.")
    if data["u"] != user.pk:
        raise PermissionDenied("This link was sent to someone else.", code="link_not_yours")
    try:
        with transaction.atomic():
            LinkUse.objects.create(nonce=data["n"], user=user, request_id=uuid.UUID(data["r"]))
    except IntegrityError as exc:
        raise LinkUsed() from exc
    return uuid.UUID(data["r"])
