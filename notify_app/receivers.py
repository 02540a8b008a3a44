"""Connects the approvals' ``approval_changed`` signal to the outbox (inside the change's
transaction: a rolled-back change notifies nobody)."""

from typing import Any

from approvals_app.models import ApprovalRequest
from notify_app.services import notifications_enqueue


def on_approval_changed(sender: Any, *, approval: ApprovalRequest, what: str, **kwargs: Any) -> None:
    notifications_enqueue(approval=approval, what=what)
