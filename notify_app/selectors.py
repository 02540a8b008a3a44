"""Reads for notifications: who is told about a request."""

from typing import Any

from django.contrib.auth.models import User
from django.db.models import Q, QuerySet

from agentops.permissions import DECIDE_APPROVALS
from agentops.teams import REVIEW_ROLES
from approvals_app.models import ApprovalRequest


def _with_decide_perm(qs: QuerySet[User]) -> QuerySet[User]:
    app_label, codename = DECIDE_APPROVALS.split(".")
    perm = Q(user_permissions__codename=codename, user_permissions__content_type__app_label=app_label) | Q(
        groups__permissions__codename=codename, groups__permissions__content_type__app_label=app_label)
    return qs.filter(perm | Q(is_superuser=True))


def eligible_reviewers(approval: ApprovalRequest) -> list[User]:
    """The active reviewers of the request's team with an email who may decide it: in its reviewer
    group when the policy names one, and neither the session's owner nor the turn's author
    (four-eyes). One query."""
    qs = User.objects.filter(is_active=True, team_memberships__team_id=approval.team_id,
                             team_memberships__role__in=REVIEW_ROLES).exclude(email="")
    qs = _with_decide_perm(qs)
    if approval.reviewer_group_id is not None:
        qs = qs.filter(groups__id=approval.reviewer_group_id)
    excluded: list[Any] = [approval.session.owner_id, approval.turn.created_by_id]
    qs = qs.exclude(pk__in=[pk for pk in excluded if pk is not None])
    return list(qs.distinct().order_by("username"))


def escalation_recipients(approval: ApprovalRequest) -> list[User]:
    """The members (with an email) of the request's escalation group who belong to its team."""
    if approval.escalation_group_id is None:
        return []
    return list(User.objects.filter(is_active=True, groups__id=approval.escalation_group_id,
                                    team_memberships__team_id=approval.team_id).exclude(email="")
                .distinct().order_by("username"))
