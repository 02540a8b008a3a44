"""The engine wakes up when a reviewer decides (approvals_app cannot import the engine)."""

from typing import Any

from django.dispatch import receiver

from approvals_app.signals import approval_decided


@receiver(approval_decided, dispatch_uid="engine-approval-decided")
def on_approval_decided(sender: Any, turn_id: Any, **kwargs: Any) -> None:
    from sessions_app.tasks import turn_advance_task

    turn_advance_task.delay(str(turn_id))  # the signal is sent after commit
