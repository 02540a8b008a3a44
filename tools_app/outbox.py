"""The email outbox: one email per idempotency key, however often a send is retried or raced."""

import logging

from django.db import IntegrityError, transaction
from django.utils import timezone

from .models import Outbox

logger = logging.getLogger(__name__)


def outbox_send(*, idempotency_key: str, to: str, subject: str, body: str) -> tuple[Outbox, bool]:
    """Queue an email under ``idempotency_key`` and deliver it; return (row, created now).

    A second call with the same key returns the first row and sends nothing: the unique key makes
    the email-sent-twice case impossible even when two workers race on a redelivered task.
    """
    if not idempotency_key:
        raise ValueError("outbox_send needs an idempotency key")
    try:
        with transaction.atomic():
            outbox, created = Outbox.objects.get_or_create(
                idempotency_key=idempotency_key, defaults={"to": to, "subject": subject, "body": body})
    except IntegrityError:  # a concurrent insert won between our SELECT and INSERT
        outbox, created = Outbox.objects.get(idempotency_key=idempotency_key), False
    if created:
        outbox_deliver(outbox_id=outbox.pk)
        outbox.refresh_from_db()
    return outbox, created


def outbox_deliver(*, outbox_id: int) -> bool:
    """Development delivery: log the email and mark it sent. True if this call sent it.

    The conditional update claims the row, so two deliveries of the same row send once. It is
    the pending -> sent move, so the transition table must allow it (InvalidTransition otherwise).
    """
    pending, sent = Outbox.Status.PENDING, Outbox.Status.SENT
    Outbox(status=pending).ensure_can_move_to(sent)
    claimed = Outbox.objects.filter(pk=outbox_id, status=pending).update(status=sent, sent_at=timezone.now())
    if claimed:
        outbox = Outbox.objects.get(pk=outbox_id)
        logger.info("outbox #%s delivered (development): to=%s subject=%r", outbox.pk, outbox.to, outbox.subject)
    return bool(claimed)
