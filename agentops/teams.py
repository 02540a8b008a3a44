"""Team scope: which teams a user may read, operate in or review for.

The mechanism is team-scoped querysets in the selectors (not ``rules`` or ``django-guardian``):
every list, page, stream and count filters by ``team_id IN (the user's teams)``, a subquery in
the same statement, so a list costs no extra query whatever the number of teams or rows, and an
object outside the user's teams is simply absent (404), never a 403 that confirms it exists.
Per-object permission rows (guardian) would need a row per session per user and a join per read;
``rules`` predicates are evaluated per object in Python and cannot filter a list in SQL.

Superusers (admins) see every team. Inactive and anonymous users see none.
"""

from typing import Any

from django.db.models import Q, QuerySet

from agentops.domain import PermissionDenied
from agentops.models import Team, TeamMembership, TeamRole

OPERATE_ROLES = (TeamRole.OPERATOR, TeamRole.BOTH)
REVIEW_ROLES = (TeamRole.REVIEWER, TeamRole.BOTH)


def is_active(user: Any) -> bool:
    return user is not None and bool(getattr(user, "is_authenticated", False)) and bool(user.is_active)


def teams_of(user: Any, *, roles: tuple[str, ...] | None = None) -> QuerySet[Team] | None:
    """The user's teams as a lazy queryset of ids (for ``team_id__in``); None means every team."""
    if is_active(user) and user.is_superuser:
        return None
    if not is_active(user):
        return TeamMembership.objects.none().values("team_id")  # type: ignore[return-value]
    return member_teams(user.pk, roles=roles)


def member_teams(user_id: int, *, roles: tuple[str, ...] | None = None) -> QuerySet[Team]:
    """The teams where the user of ``user_id`` is a member (with one of ``roles``), as a lazy
    queryset of ids: ``teams_of`` for an active user who is not a superuser."""
    memberships = TeamMembership.objects.filter(user_id=user_id)
    if roles is not None:
        memberships = memberships.filter(role__in=roles)
    return memberships.values("team_id")  # type: ignore[return-value]


def scope(qs: QuerySet[Any], user: Any, *, field: str = "team_id", roles: tuple[str, ...] | None = None
          ) -> QuerySet[Any]:
    """``qs`` restricted to the rows of the user's teams (one subquery, no extra round trip)."""
    if not is_active(user):
        return qs.none()
    teams = teams_of(user, roles=roles)
    return qs if teams is None else qs.filter(**{f"{field}__in": teams})


def team_ids(user: Any) -> list[int] | None:
    """The ids of the user's teams, read now (None: every team). One query (none for an admin)."""
    teams = teams_of(user)
    return None if teams is None else [row["team_id"] for row in teams]  # type: ignore[index]


def has_team_role(user: Any, team_id: int, roles: tuple[str, ...]) -> bool:
    if not is_active(user):
        return False
    if user.is_superuser:
        return True
    return TeamMembership.objects.filter(user_id=user.pk, team_id=team_id, role__in=roles).exists()


def require_team_role(user: Any, team_id: int, roles: tuple[str, ...], *, what: str) -> None:
    """PermissionDenied unless the user holds one of ``roles`` in the team (the caller has
    already found the object through a scoped selector, so the user is a member)."""
    if not has_team_role(user, team_id, roles):
        raise PermissionDenied(f"Your role in this team does not allow you to {what}.",
                               code="team_role_required", details={"roles": list(roles)})


def visible_q(user: Any, *, field: str = "team_id") -> Q:
    """The scope as a Q object, for filters combined with others."""
    teams = teams_of(user)
    return Q() if teams is None else Q(**{f"{field}__in": teams})
