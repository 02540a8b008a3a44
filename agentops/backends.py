"""Django's model permissions, read in one plain query per request's user.

``ModelBackend`` reads a user's permissions with two ORM queries (the user's own, then their
groups'), built afresh for every request's new user object: building them cost more CPU than
anything else in a small API request (≈ 2 ms of a list request's ≈ 12 ms, measured with py-spy on
daphne). The same rows come here from one SQL statement with no ORM compilation; what it answers
is the same (inactive and anonymous users hold nothing, superusers everything, cached on the
user object for the rest of the request like Django's ``_perm_cache``), and nothing is cached
across requests, so a permission taken away counts from the next request on.
"""

from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.db import connection

from agentops.prepared import Prepared

_USER = Prepared(lambda pk: User.objects.filter(pk=pk))


def permissions_of_user_sql(user_id: str) -> str:
    """SQL for the ids of the permissions a user holds, given to them or to one of their groups;
    ``user_id`` is the SQL expression of the user's id (``%s``, or a column of an outer query)."""
    user_permissions = User.user_permissions.through._meta.db_table
    user_groups = User.groups.through._meta.db_table
    group_permissions = Group.permissions.through._meta.db_table
    return (f"SELECT up.permission_id FROM {user_permissions} up WHERE up.user_id = {user_id} "
            f"UNION SELECT gp.permission_id FROM {group_permissions} gp "
            f"JOIN {user_groups} ug ON ug.group_id = gp.group_id WHERE ug.user_id = {user_id}")


def _statement() -> str:
    permission, content_type = Permission._meta.db_table, ContentType._meta.db_table
    return (f"SELECT ct.app_label, p.codename FROM {permission} p "
            f"JOIN {content_type} ct ON ct.id = p.content_type_id WHERE p.id IN ({permissions_of_user_sql('%s')})")


class OneQueryModelBackend(ModelBackend):
    """``ModelBackend`` whose ``get_all_permissions`` reads a non-superuser's permissions in one
    statement, and whose ``get_user`` (every browser request and WebSocket connect asks it) runs
    SQL compiled once (``agentops.prepared``); authentication and the per-kind reads are Django's own."""

    def get_user(self, user_id: Any) -> User | None:
        try:
            pk = User._meta.pk.to_python(user_id)
        except ValidationError:
            return None
        user = _USER.first(pk=pk) if pk is not None else None
        return user if user is not None and self.user_can_authenticate(user) else None

    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if user_obj.is_superuser:
            return super().get_all_permissions(user_obj, obj)
        if not hasattr(user_obj, "_perm_cache"):
            with connection.cursor() as cursor:
                cursor.execute(_statement(), [user_obj.pk, user_obj.pk])
                user_obj._perm_cache = {f"{app_label}.{codename}" for app_label, codename in cursor.fetchall()}
        perms: set[str] = user_obj._perm_cache
        return perms
