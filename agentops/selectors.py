"""Reads of agentops's own rows."""

import hashlib

from django.contrib.auth.models import AbstractBaseUser

from agentops.models import ApiToken
from agentops.prepared import Prepared

TOKEN_PREFIX = "aop_"


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# Every API request asks it: compiled once (agentops/prepared.py).
_LIVE_TOKEN = Prepared(lambda digest: ApiToken.objects.select_related("user")
                       .filter(token_sha256=digest, revoked_at__isnull=True).order_by("pk")[:1])


def api_token_get(token: str) -> ApiToken | None:
    """The live (not revoked) token row of an active user, with its user; None otherwise. One query."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    row = _LIVE_TOKEN.first(digest=token_sha256(token))
    return row if row is not None and row.user.is_active else None


def api_token_user(token: str) -> AbstractBaseUser | None:
    """The user a token authenticates, without recording its use."""
    row = api_token_get(token)
    return row.user if row is not None else None
