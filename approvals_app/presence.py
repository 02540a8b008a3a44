"""Presence: who is looking at a request right now, over the queue's WebSocket, without a
database read per message.

The decision page carries a signed token naming the request and its team; the page's socket
sends it (``{"type": "viewing", "token": ...}``) every ``PRESENCE_SECONDS / 2``; the consumer
checks the signature and that the team is one of its own groups, then forwards
``{"type": "presence", "request_id", "user", "ttl"}`` to that team's reviewers. Clients forget
a viewer after ``ttl`` seconds without news. Nothing is stored.
"""

from typing import Any

from django.core import signing

from approvals_app.models import ApprovalRequest

PRESENCE_SALT = "agentops.approvals.presence"
PRESENCE_SECONDS = 30
TOKEN_MAX_AGE = 24 * 3600


def presence_token(approval: ApprovalRequest) -> str:
    return signing.dumps({"r": str(approval.request_id), "t": approval.team_id}, salt=PRESENCE_SALT)


def presence_load(token: Any) -> tuple[str, int] | None:
    """(request id, team id) of a valid token, else None."""
    if not isinstance(token, str) or len(token) > 500:
        return None
    try:
        data = signing.loads(token, salt=PRESENCE_SALT, max_age=TOKEN_MAX_AGE)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("r"), str) or not isinstance(data.get("t"), int):
        return None
    return data["r"], data["t"]
