"""Celery interface of the notification outbox."""

from celery import shared_task

from notify_app.services import delivery_send, outbox_sweep


@shared_task(acks_late=True, ignore_result=True)
def delivery_send_task(delivery_pk: int) -> None:
    delivery_send(delivery_pk=delivery_pk)


@shared_task(acks_late=True, ignore_result=True)
def outbox_sweep_task() -> int:
    return outbox_sweep()
