"""The permission backend answers what Django's ModelBackend answers, in one query per user
object, and a permission taken away counts from the next request's user object on."""

from typing import Any

import pytest
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AnonymousUser, Group, Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentops.backends import OneQueryModelBackend
from agentops.permissions import DECIDE_APPROVALS, OPERATE_SESSIONS, VIEW_SESSIONS, has_perm


def _perm(dotted: str) -> Permission:
    app_label, codename = dotted.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)


def _fresh(user: User) -> User:
    """The user as the next request loads it (no permission cache on the object)."""
    return User.objects.get(pk=user.pk)


@pytest.fixture
def users() -> dict[str, Any]:
    direct = User.objects.create_user("direct-perm")
    direct.user_permissions.add(_perm(DECIDE_APPROVALS))
    crew = Group.objects.create(name="crew")
    crew.permissions.add(_perm(OPERATE_SESSIONS), _perm(VIEW_SESSIONS))
    both = User.objects.create_user("both")
    both.groups.add(crew)
    both.user_permissions.add(_perm(DECIDE_APPROVALS), _perm(VIEW_SESSIONS))  # also from the group
    grouped = User.objects.create_user("grouped")
    grouped.groups.add(crew, Group.objects.create(name="empty"))
    inactive = User.objects.create_user("inactive", is_active=False)
    inactive.groups.add(crew)
    boss = User.objects.create_superuser("boss")
    return {"direct": direct, "both": both, "grouped": grouped, "inactive": inactive, "boss": boss,
            "nobody": User.objects.create_user("nobody"), "crew": crew}


@pytest.mark.django_db
def test_every_kind_of_user_gets_what_django_model_backend_gives(users: dict[str, Any]) -> None:
    ours, django = OneQueryModelBackend(), ModelBackend()
    for name in ("direct", "both", "grouped", "inactive", "boss", "nobody"):
        expected = django.get_all_permissions(_fresh(users[name]))
        assert ours.get_all_permissions(_fresh(users[name])) == expected, name
    assert ours.get_all_permissions(_fresh(users["both"])) == {DECIDE_APPROVALS, VIEW_SESSIONS, OPERATE_SESSIONS}
    assert ours.get_all_permissions(_fresh(users["inactive"])) == set()
    assert ours.get_all_permissions(AnonymousUser()) == set()
    assert ours.get_all_permissions(_fresh(users["both"]), obj=object()) == set()


@pytest.mark.django_db
def test_a_user_object_reads_its_permissions_once_in_one_query(users: dict[str, Any]) -> None:
    user = _fresh(users["both"])
    with CaptureQueriesContext(connection) as queries:
        assert has_perm(user, OPERATE_SESSIONS) and has_perm(user, DECIDE_APPROVALS)
        assert not has_perm(user, "tools_app.view_tooldefinition")
    assert len(queries) == 1


@pytest.mark.django_db
def test_a_permission_taken_away_counts_from_the_next_request(users: dict[str, Any]) -> None:
    assert has_perm(_fresh(users["grouped"]), OPERATE_SESSIONS)
    users["crew"].permissions.remove(_perm(OPERATE_SESSIONS))
    assert not has_perm(_fresh(users["grouped"]), OPERATE_SESSIONS)
    assert has_perm(_fresh(users["grouped"]), VIEW_SESSIONS)
    users["grouped"].groups.clear()
    assert not has_perm(_fresh(users["grouped"]), VIEW_SESSIONS)


@pytest.mark.django_db
def test_the_user_of_a_session_is_loaded_as_modelbackend_loads_it(users: dict[str, Any]) -> None:
    """``get_user`` (its query compiled once): each user as Django's ModelBackend finds them, twice
    (the second time through the compiled SQL); an inactive user, an unknown id and a malformed one
    are no user."""
    ours, django = OneQueryModelBackend(), ModelBackend()
    for _ in range(2):
        for user in users.values():
            for user_id in (user.pk, str(user.pk)):
                found, expected = ours.get_user(user_id), django.get_user(user_id)
                assert (found and found.pk) == (expected and expected.pk)
                assert found is None or (found.username, found.is_superuser) == (user.username, user.is_superuser)
    assert ours.get_user(users["inactive"].pk) is None
    assert ours.get_user(10**9) is None and ours.get_user("not-a-number") is None and ours.get_user(None) is None
