"""What the approvals tell the layers above them without importing them.

``approval_changed`` is sent inside the transaction that changed a request (created, voted,
decided, escalated, expired), with ``approval`` and ``what``. ``notify_app`` turns it into outbox
rows in that same transaction: a rolled-back decision notifies nobody, a committed one is
delivered at least once.
"""

from django.dispatch import Signal

approval_changed = Signal()
