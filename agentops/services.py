"""API tokens: minted once, stored as a SHA-256, checked in constant time by lookup of the hash.
Users for scripts: roles and team memberships."""

import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group, User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from agentops.domain import InvalidArguments, NotFound
from agentops.models import ApiToken, Team, TeamMembership, TeamRole
from agentops.selectors import TOKEN_PREFIX, api_token_get, token_sha256

LAST_USED_RESOLUTION = timedelta(seconds=60)
SHOWN_PREFIX = 12  # the characters of a token kept in clear (ApiToken.prefix), to recognise it


def api_token_create(*, username: str, name: str = "") -> tuple[ApiToken, str]:
    """Mint a token for a user. Returns the row and the token, which is never stored."""
    try:
        user = get_user_model().objects.get(username=username)
    except get_user_model().DoesNotExist as exc:
        raise NotFound(f"No user {username!r}") from exc
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(user=user, name=name, prefix=token[:SHOWN_PREFIX], token_sha256=token_sha256(token))
    return row, token


def api_tokens_revoke(tokens: "QuerySet[ApiToken]") -> int:
    """Revoke these tokens, for good: the next request with one is refused, and nothing makes a
    revoked token valid again (the admin shows ``revoked_at`` read-only). Returns how many were
    still valid."""
    return tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


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


# A role name on the command line → the group that holds its permissions.
ROLE_GROUPS = {"operator": "operators", "reviewer": "reviewers", "admin": "admins"}


@transaction.atomic
def user_provision(*, username: str, roles: list[str], teams: list[str],
                   password: str | None = None) -> tuple[User, bool]:
    """Create or update a user: its groups become exactly ``roles`` and its memberships exactly
    ``teams``, each with the team role the roles give (operator, reviewer or both). An unknown
    role or team is refused (InvalidArguments) and nothing changes."""
    unknown_roles = sorted(set(roles) - set(ROLE_GROUPS))
    if unknown_roles:
        raise InvalidArguments(f"Unknown role(s): {', '.join(unknown_roles)} (known: {', '.join(ROLE_GROUPS)})",
                               details={"roles": unknown_roles})
    team_rows = {t.slug: t for t in Team.objects.filter(slug__in=teams)}
    unknown_teams = sorted(set(teams) - set(team_rows))
    if unknown_teams:
        raise InvalidArguments(f"Unknown team(s): {', '.join(unknown_teams)} (create them in the admin first)",
                               details={"teams": unknown_teams})
    groups = {g.name: g for g in Group.objects.filter(name__in=[ROLE_GROUPS[r] for r in roles])}
    missing = sorted({ROLE_GROUPS[r] for r in roles} - set(groups))
    if missing:
        raise InvalidArguments(f"The role groups are missing: {', '.join(missing)} (run migrate)")
    if not username.strip():
        raise InvalidArguments("The username must not be empty.")
    user, created = User.objects.get_or_create(username=username)
    if password is not None:
        try:  # the validators the login's password forms apply (12 characters, not common, ...)
            validate_password(password, user)
        except ValidationError as exc:
            raise InvalidArguments("The password is refused: " + " ".join(exc.messages)) from exc
        user.set_password(password)
    elif created:
        user.set_unusable_password()
    user.is_staff = user.is_superuser = "admin" in roles
    user.save()
    user.groups.set(groups.values())
    operator = bool({"operator", "admin"} & set(roles))
    reviewer = bool({"reviewer", "admin"} & set(roles))
    role = TeamRole.BOTH if operator and reviewer else TeamRole.REVIEWER if reviewer else TeamRole.OPERATOR
    TeamMembership.objects.filter(user=user).exclude(team__slug__in=teams).delete()
    for team in team_rows.values():
        TeamMembership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return user, created
