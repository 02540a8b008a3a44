"""Writes for tools_app: seeding the tool registry and the email outbox."""

import logging

from django.db import IntegrityError, transaction
from django.utils import timezone

from .builtin import BUILTIN_TOOLS
from .models import Outbox, ToolDefinition

logger = logging.getLogger(__name__)


def tool_definitions_seed() -> None:
    """Create a ToolDefinition for every built-in tool that has none.

    Existing rows are left alone: the admin may have changed the approval mode, timeout or network,
    and a deploy must never undo that.
    """
    for tool in BUILTIN_TOOLS.values():
        ToolDefinition.objects.get_or_create(
            name=tool.name,
            defaults={"description": tool.description, "kind": ToolDefinition.Kind.BUILTIN,
                      "parameters_schema": tool.parameters_schema, "approval_mode": tool.approval_mode,
                      "network": tool.network, "timeout_seconds": tool.timeout_seconds,
                      "idempotent": tool.idempotent},
        )


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

    The conditional update claims the row, so two deliveries of the same row send once.
    """
    claimed = Outbox.objects.filter(pk=outbox_id, status=Outbox.Status.PENDING).update(
        status=Outbox.Status.SENT, sent_at=timezone.now())
    if claimed:
        outbox = Outbox.objects.get(pk=outbox_id)
        logger.info("outbox #%s delivered (development): to=%s subject=%r", outbox.pk, outbox.to, outbox.subject)
    return bool(claimed)
