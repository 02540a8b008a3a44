"""The webhook signature and the one-time email links.

Signature: ``X-Agentops-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>``.
A receiver recomputes it over the raw body, compares in constant time and refuses a ``t`` older
than its tolerance (a replayed capture is refused). ``signature_verify`` is that check.
"""

import hashlib
import hmac
import secrets
import time
import uuid
from typing import Any

from django.core import signing

SIGNATURE_HEADER = "X-Agentops-Signature"
LINK_SALT = "agentops.notify.approval-link"


def signature_header(*, secret: str, body: bytes, timestamp: int | None = None) -> str:
    t = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={digest}"


def signature_verify(*, secret: str, header: str, body: bytes, tolerance_seconds: int = 300,
                     now: float | None = None) -> bool:
    """A receiver's check: the header's HMAC over this body, and a timestamp within tolerance."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        t = int(parts["t"])
        given = parts["v1"]
    except (ValueError, KeyError):
        return False
    if abs((time.time() if now is None else now) - t) > tolerance_seconds:
        return False
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, given)


def link_token(*, request_id: uuid.UUID, user_id: int) -> str:
    """A signed token for one recipient and one request, with a fresh nonce (used once)."""
    return signing.dumps({"r": str(request_id), "u": user_id, "n": secrets.token_hex(16)}, salt=LINK_SALT)


def link_load(token: str, *, max_age_seconds: int) -> dict[str, Any] | None:
    """The token's content, or None when it is forged, malformed or older than ``max_age_seconds``."""
    try:
        data = signing.loads(token, salt=LINK_SALT, max_age=max_age_seconds)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or not {"r", "u", "n"} <= set(data):
        return None
    return data
