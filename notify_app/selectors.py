"""Reads for notifications: who is told about a request."""

from typing import Any

from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType

from agentops.backends import permissions_of_user_sql
from agentops.models import TeamMembership
from agentops.permissions import DECIDE_APPROVALS
from agentops.teams import REVIEW_ROLES
from approvals_app.models import ApprovalRequest


def _eligible_statement(*, in_group: bool, excluded: int) -> str:
    """The reviewers' statement (see ``eligible_reviewers``): written out, not built by the ORM,
    whose compilation of this query (four joins through the permission tables, ORed, then
    DISTINCT) was the largest single cost of asking for an approval: 14 % of the model gateway's
    CPU under the load proof (py-spy, ``--gil``), spent in the engine's tick that asks."""
    user, membership = User._meta.db_table, TeamMembership._meta.db_table
    user_groups = User.groups.through._meta.db_table
    permission, content_type = Permission._meta.db_table, ContentType._meta.db_table
    decide = (f"SELECT 1 FROM {permission} p JOIN {content_type} ct ON ct.id = p.content_type_id "
              f"WHERE p.codename = %s AND ct.app_label = %s AND p.id IN ({permissions_of_user_sql('u.id')})")
    group = (f" AND EXISTS (SELECT 1 FROM {user_groups} g WHERE g.user_id = u.id AND g.group_id = %s)"
             if in_group else "")
    exclude = f" AND u.id NOT IN ({', '.join(['%s'] * excluded)})" if excluded else ""
    return (f"SELECT u.* FROM {user} u WHERE u.is_active AND u.email <> '' "
            f"AND EXISTS (SELECT 1 FROM {membership} m WHERE m.user_id = u.id AND m.team_id = %s "
            f"AND m.role IN ({', '.join(['%s'] * len(REVIEW_ROLES))})) "
            f"AND (u.is_superuser OR EXISTS ({decide})){group}{exclude} ORDER BY u.username")


def eligible_reviewers(approval: ApprovalRequest) -> list[User]:
    """The active reviewers of the request's team with an email who may decide it (the permission,
    given to them or to one of their groups, or superuser): in its reviewer group when the policy
    names one, and neither the session's owner nor the turn's author (four-eyes). One query."""
    app_label, codename = DECIDE_APPROVALS.split(".")
    excluded = [pk for pk in (approval.session.owner_id, approval.turn.created_by_id) if pk is not None]
    params: list[Any] = [approval.team_id, *REVIEW_ROLES, codename, app_label]
    if approval.reviewer_group_id is not None:
        params.append(approval.reviewer_group_id)
    statement = _eligible_statement(in_group=approval.reviewer_group_id is not None, excluded=len(excluded))
    return list(User.objects.raw(statement, [*params, *excluded]))


def escalation_recipients(approval: ApprovalRequest) -> list[User]:
    """The members (with an email) of the request's escalation group who belong to its team."""
    if approval.escalation_group_id is None:
        return []
    return list(User.objects.filter(is_active=True, groups__id=approval.escalation_group_id,
                                    team_memberships__team_id=approval.team_id).exclude(email="")
                .distinct().order_by("username"))
