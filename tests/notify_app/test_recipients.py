"""Who is told about a request: ``eligible_reviewers`` is one written-out statement; here it
answers as the ORM query it replaced does, for every kind of user it must keep or leave out."""

from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext

from agentops.models import TeamMembership
from agentops.teams import REVIEW_ROLES
from approvals_app.models import ApprovalRequest
from notify_app.selectors import eligible_reviewers
from tests import factories
from tests.approvals_app.review_helpers import pending, policy, reviewers

pytestmark = pytest.mark.django_db


def _orm_reference(approval: ApprovalRequest) -> list[User]:
    """The ORM query eligible_reviewers was, kept here as the definition it must match."""
    qs = User.objects.filter(is_active=True, team_memberships__team_id=approval.team_id,
                             team_memberships__role__in=REVIEW_ROLES).exclude(email="")
    perm = Q(user_permissions__codename="decide_approvalrequest",
             user_permissions__content_type__app_label="approvals_app") | Q(
        groups__permissions__codename="decide_approvalrequest",
        groups__permissions__content_type__app_label="approvals_app")
    qs = qs.filter(perm | Q(is_superuser=True))
    if approval.reviewer_group_id is not None:
        qs = qs.filter(groups__id=approval.reviewer_group_id)
    excluded: list[Any] = [approval.session.owner_id, approval.turn.created_by_id]
    qs = qs.exclude(pk__in=[pk for pk in excluded if pk is not None])
    return list(qs.distinct().order_by("username"))


def _cast(group: Group | None = None) -> dict[str, User]:
    """One user of each kind, in the default team (the requests' team) unless said otherwise."""
    decide = Permission.objects.get(codename="decide_approvalrequest", content_type__app_label="approvals_app")
    (by_group,) = reviewers(1, group=group)
    (no_email,) = reviewers(1, group=group, email=False)
    (inactive,) = reviewers(1, group=group)
    inactive.is_active = False
    inactive.save()
    direct = factories.user(email="direct@example.org", role="reviewer")
    direct.user_permissions.add(decide)
    superuser = factories.user(email="root@example.org", is_superuser=True, role="both")
    operator_role = factories.user(groups=["reviewers"], email="oprole@example.org", role="operator")
    other_team = factories.user(groups=["reviewers"], email="elsewhere@example.org", teams=[])
    TeamMembership.objects.create(user=other_team, team=factories.team("elsewhere"), role="reviewer")
    no_permission = factories.user(email="noperm@example.org", role="reviewer")
    if group is not None:
        for u in (direct, superuser, operator_role, other_team, no_permission):
            u.groups.add(group)
    outside_group = reviewers(1)[0] if group is not None else None
    cast = {"by_group": by_group, "no_email": no_email, "inactive": inactive, "direct": direct,
            "superuser": superuser, "operator_role": operator_role, "other_team": other_team,
            "no_permission": no_permission}
    if outside_group is not None:
        cast["outside_group"] = outside_group
    return cast


def test_the_statement_keeps_and_leaves_out_whom_the_orm_query_did() -> None:
    cast = _cast()
    approval = pending()
    with CaptureQueriesContext(connection) as queries:
        got = eligible_reviewers(approval)
    assert len([q for q in queries.captured_queries if "auth_user" in q["sql"]]) == 1
    assert [u.username for u in got] == [u.username for u in _orm_reference(approval)]
    assert {u.pk for u in got} == {cast["by_group"].pk, cast["direct"].pk, cast["superuser"].pk}
    assert [u.username for u in got] == sorted(u.username for u in got)


def test_a_reviewer_group_and_four_eyes_narrow_it_the_same_way() -> None:
    deployers = Group.objects.create(name="deployers")
    cast = _cast(group=deployers)
    policy(team=factories.team(), tool_name="run_command", reviewer_group=deployers)
    approval = pending()
    # the session's owner, a reviewer of the group too, is left out (four-eyes)
    approval.session.owner.groups.add(deployers, Group.objects.get(name="reviewers"))
    approval.session.owner.email = "owner@example.org"
    approval.session.owner.save()
    TeamMembership.objects.filter(user=approval.session.owner).update(role="both")
    assert approval.reviewer_group_id == deployers.pk
    got = eligible_reviewers(approval)
    assert [u.username for u in got] == [u.username for u in _orm_reference(approval)]
    assert {u.pk for u in got} == {cast["by_group"].pk, cast["direct"].pk, cast["superuser"].pk}
