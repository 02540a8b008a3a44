"""The permissions the interfaces check, named once, and the one check.

Roles are groups (a data migration creates them): ``operators`` hold OPERATE_SESSIONS and
VIEW_SESSIONS, ``reviewers`` DECIDE_APPROVALS and VIEW_SESSIONS, ``admins`` everything.
"""

from typing import Any

from agentops.domain import PermissionDenied

OPERATE_SESSIONS = "sessions_app.operate_agentsession"
VIEW_SESSIONS = "sessions_app.view_agentsession"
DECIDE_APPROVALS = "approvals_app.decide_approvalrequest"
VIEW_TOOLS = "tools_app.view_tooldefinition"


def require_perm(user: Any, perm: str) -> None:
    """Raise PermissionDenied (403) unless ``user`` is active and holds ``perm``."""
    if user is None or not user.is_active or not user.has_perm(perm):
        raise PermissionDenied(f"You need the permission {perm}.", details={"permission": perm})
