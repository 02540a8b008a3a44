"""The admin, scoped to the user's teams: a staff user who is not a superuser sees and picks only
the rows of their teams, as everywhere else (``agentops/teams.py``); superusers see every team.

Every other page, the API and the streams were scoped by team, and the admin was not: a team's
staff member given the admins group listed every team's sessions, approvals, webhook endpoints and
MCP servers, and could pick another team in a form. ``team_scoped_everywhere`` (called once every
app's admin is registered, as ``strict_json_everywhere``) gives each registered ModelAdmin its
model's path to the team (``TEAM_PATHS``): its list, its change pages (another team's row is "not
found") and the choices of its forms' relations. What belongs to no team (users and groups, the
login log, the test-mail outbox) is for superusers only (``SUPERUSER_ONLY``). A model registered
without either is refused at start: a new admin cannot forget its scope.
"""

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest

from agentops import teams

# model label → the path from a row to its team's id; None: its own rule in ``_visible``.
TEAM_PATHS: dict[str, str | None] = {
    "agentops.Team": "id",
    "agentops.TeamMembership": "team_id",
    "agentops.ApiToken": None,  # the tokens of the user's teams' members
    "sessions_app.AgentProfile": "team_id",
    "sessions_app.AgentSession": "team_id",
    "sessions_app.Turn": "session__team_id",
    "sessions_app.Step": "session__team_id",
    "sessions_app.Event": "session__team_id",
    "sessions_app.Artifact": "session__team_id",
    "approvals_app.ApprovalRequest": "team_id",
    "approvals_app.ApprovalGrant": "session__team_id",
    "approvals_app.ApprovalAudit": "team_id",
    "approvals_app.ApprovalPolicy": "team_id",
    "approvals_app.ApprovalVote": "request__team_id",
    "notify_app.WebhookEndpoint": "team_id",
    "notify_app.Delivery": "team_id",
    "vault_app.Secret": "team_id",
    "mcp_app.McpServer": "team_id",
    "hosts_app.SandboxHost": None,  # the team's hosts and the shared ones (no team)
    "hosts_app.AgentHostPolicy": "agent__team_id",
    "hosts_app.SessionPlacement": "session__team_id",
    "hosts_app.RunnerResult": "step__session__team_id",
    "tools_app.ToolDefinition": None,  # the built-in tools and the team's own (``tool_definitions_visible``)
}
SUPERUSER_ONLY = {"auth.User", "auth.Group", "axes.AccessAttempt", "axes.AccessLog", "axes.AccessFailureLog",
                  "tools_app.Outbox"}


def _visible(model: type[Model], user: Any) -> Q | None:
    """The rows of ``model`` that ``user`` may see in the admin; None: every row (a superuser)."""
    ids = teams.teams_of(user)
    if ids is None:
        return None
    label = model._meta.label
    if label == "agentops.ApiToken":
        return Q(user__team_memberships__team_id__in=ids)
    if label == "hosts_app.SandboxHost":
        return Q(team_id__in=ids) | Q(team__isnull=True)
    if label == "tools_app.ToolDefinition":
        from tools_app.models import ToolDefinition

        mine = ToolDefinition.objects.filter(Q(kind=ToolDefinition.Kind.CLIENT, agents__team_id__in=ids)
                                             | Q(mcp_tool__server__team_id__in=ids))
        return Q(pk__in=mine.values("pk")) | (Q(mcp_tool__isnull=True) & ~Q(kind=ToolDefinition.Kind.CLIENT))
    return Q(**{f"{TEAM_PATHS[label]}__in": ids})


def scoped(qs: QuerySet[Any], user: Any) -> QuerySet[Any]:
    """``qs`` restricted to what ``user`` may see in the admin (a path through a to-many relation
    is read without duplicates)."""
    if not teams.is_active(user):
        return qs.none()
    if qs.model._meta.label in SUPERUSER_ONLY:
        return qs if user.is_superuser else qs.none()
    q = _visible(qs.model, user)
    if q is None:
        return qs
    return qs.filter(pk__in=qs.model._default_manager.filter(q).values("pk"))


def _relation_choices(original: Callable[..., Any]) -> Callable[..., Any]:
    def formfield(db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = original(db_field, request, **kwargs)
        queryset = getattr(field, "queryset", None)
        if queryset is not None and queryset.model._meta.label in {*TEAM_PATHS, *SUPERUSER_ONLY}:
            field.queryset = scoped(queryset, request.user)
        return field
    return formfield


def _superusers_only(model_admin: "admin.ModelAdmin[Any]") -> None:
    for name in ("has_view_permission", "has_change_permission", "has_add_permission", "has_delete_permission",
                 "has_module_permission"):
        original = getattr(model_admin, name)

        def check(request: HttpRequest, *args: Any, _original: Callable[..., bool] = original) -> bool:
            return bool(request.user.is_superuser) and _original(request, *args)
        setattr(model_admin, name, check)


def team_scoped_everywhere(site: admin.AdminSite) -> None:
    """Scope every registered ModelAdmin (see the module's docstring); refuses a model that is in
    neither ``TEAM_PATHS`` nor ``SUPERUSER_ONLY``."""
    for model, model_admin in site._registry.items():
        label = model._meta.label
        if label not in TEAM_PATHS and label not in SUPERUSER_ONLY:
            raise RuntimeError(f"the admin of {label} has no team scope: add it to agentops.admin_teams.TEAM_PATHS "
                               "(or SUPERUSER_ONLY)")
        if label in SUPERUSER_ONLY:
            _superusers_only(model_admin)
        original_queryset = model_admin.get_queryset

        def get_queryset(request: HttpRequest, _original: Callable[..., QuerySet[Any]] = original_queryset
                         ) -> QuerySet[Any]:
            return scoped(_original(request), request.user)
        model_admin.get_queryset = get_queryset  # type: ignore[method-assign]
        model_admin.formfield_for_foreignkey = _relation_choices(  # type: ignore[method-assign]
            model_admin.formfield_for_foreignkey)
        model_admin.formfield_for_manytomany = _relation_choices(  # type: ignore[method-assign]
            model_admin.formfield_for_manytomany)
