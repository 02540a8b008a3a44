"""Plain rows for tests; other states are reached through services."""

from typing import Any

from django.contrib.auth.models import Group, User

from agentops.models import Team, TeamMembership
from sessions_app import services
from sessions_app.models import AgentProfile, AgentSession, Step, Turn
from tools_app.models import ToolDefinition

_counter = {"n": 0}


def _next() -> int:
    _counter["n"] += 1
    return _counter["n"]


def ensure_roles() -> None:
    """Transactional tests flush every table, data migrations included: put the roles back."""
    if not Group.objects.filter(name="reviewers").exists():
        import importlib

        from django.apps import apps

        importlib.import_module("agentops.migrations.0002_roles").create_roles(apps, None)


def team(slug: str = "default", **fields: Any) -> Team:
    """The team ``slug`` (the default one holds every factory user and agent unless told)."""
    return Team.objects.get_or_create(slug=slug, defaults={"name": slug.title(), **fields})[0]


def role_of_groups(groups: list[str]) -> str:
    operator = bool({"operators", "admins"} & set(groups))
    reviewer = bool({"reviewers", "admins"} & set(groups))
    return "both" if operator and reviewer else "reviewer" if reviewer else "operator"


def member(user_obj: User, team_obj: Team | str, role: str = "operator") -> TeamMembership:
    t = team(team_obj) if isinstance(team_obj, str) else team_obj
    return TeamMembership.objects.update_or_create(team=t, user=user_obj, defaults={"role": role})[0]


def user(username: str | None = None, *, groups: list[str] | None = None, password: str = "pw",
         teams: list[str] | None = None, role: str | None = None, **extra: Any) -> User:
    """A user in ``groups`` (global permissions) and a member of ``teams`` (default: the default
    team) with ``role`` (default: what the groups give)."""
    if groups:
        ensure_roles()
    u = User.objects.create_user(username=username or f"user{_next()}", password=password, **extra)
    for name in groups or []:
        u.groups.add(Group.objects.get(name=name))
    for slug in ["default"] if teams is None else teams:
        member(u, slug, role or role_of_groups(groups or []))
    return u


def agent_profile(**fields: Any) -> AgentProfile:
    n = _next()
    defaults: dict[str, Any] = {"name": f"Agent {n}", "slug": f"agent-{n}", "model": "scripted",
                                "instructions": "You are a careful agent."}
    defaults.update(fields)
    if "team" not in defaults and "team_id" not in defaults:
        defaults["team"] = team()
    return AgentProfile.objects.create(**defaults)


def tool_definition(name: str = "echo", **fields: Any) -> ToolDefinition:
    defaults: dict[str, Any] = {"parameters_schema": {"type": "object", "properties": {}}}
    defaults.update(fields)
    return ToolDefinition.objects.create(name=name, **defaults)


def session(*, agent: AgentProfile | None = None, owner: User | None = None, **kwargs: Any) -> AgentSession:
    return services.session_create(agent=agent or agent_profile(), owner=owner or user(), **kwargs)


def turn(session_obj: AgentSession | None = None, *, input: str = "hello") -> Turn:
    return services.turn_create(session_id=(session_obj or session()).id, input=input)


def step(turn_obj: Turn, *, kind: str = "tool", tool_name: str = "echo", index: int | None = None,
         **fields: Any) -> Step:
    if index is None:
        index = Step.objects.filter(turn=turn_obj).count()
    return Step.objects.create(session_id=turn_obj.session_id, turn=turn_obj, index=index, kind=kind,
                               tool_name=tool_name, **fields)
