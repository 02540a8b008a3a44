"""The permissions the interfaces check, named once, and the one check.

Roles are groups (a data migration creates them): ``operators`` hold OPERATE_SESSIONS,
VIEW_SESSIONS and VIEW_APPROVALS, ``reviewers`` DECIDE_APPROVALS, VIEW_APPROVALS and
VIEW_SESSIONS, ``admins`` everything.
"""

from typing import Any

from agentops.domain import PermissionDenied

OPERATE_SESSIONS = "sessions_app.operate_agentsession"
VIEW_SESSIONS = "sessions_app.view_agentsession"
DECIDE_APPROVALS = "approvals_app.decide_approvalrequest"
VIEW_APPROVALS = "approvals_app.view_approvalrequest"
VIEW_TOOLS = "tools_app.view_tooldefinition"


def has_perm(user: Any, perm: str) -> bool:
    """Is ``user`` an active user holding ``perm``? (A template flag; ``require_perm`` to refuse.)"""
    return user is not None and bool(user.is_active) and bool(user.has_perm(perm))


def require_perm(user: Any, perm: str) -> None:
    """Raise PermissionDenied (403) unless ``user`` is active and holds ``perm``."""
    if not has_perm(user, perm):
        raise PermissionDenied(f"You need the permission {perm}.", details={"permission": perm})
