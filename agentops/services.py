"""API tokens: minted once, stored as a SHA-256, checked in constant time by lookup of the hash."""

import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from agentops.domain import NotFound
from agentops.models import ApiToken
from agentops.selectors import TOKEN_PREFIX, api_token_get, token_sha256

LAST_USED_RESOLUTION = timedelta(seconds=60)


def api_token_create(*, username: str, name: str = "") -> tuple[ApiToken, str]:
    """Mint a token for a user. Returns the row and the token, which is never stored."""
    try:
        user = get_user_model().objects.get(username=username)
    except get_user_model().DoesNotExist as exc:
        raise NotFound(f"No user {username!r}") from exc
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(user=user, name=name, prefix=token[:12], token_sha256=token_sha256(token))
    return row, token


def api_token_authenticate(token: str) -> AbstractBaseUser | None:
    """The user a token authenticates, recording when it was last used; None for a bad token."""
    row = api_token_get(token)
    if row is None:
        return None
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        # Minute resolution is enough to see which tokens are in use: a write per request is not.
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user
