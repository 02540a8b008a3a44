"""Teams: every read is scoped to the user's teams; an object outside them is a 404; the
agentops_user command provisions users for scripts."""

import uuid
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from agentops.domain import NotFound
from agentops.models import TeamMembership
from approvals_app import services as approval_services
from sessions_app.models import AgentSession
from sessions_app.selectors import agent_get, session_exists
from tests import factories
from tests.helpers import api_client, login
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db


def _two_teams() -> tuple[AgentSession, AgentSession, User]:
    """A session in team a and one in team b; an operator of team a only."""
    ours = factories.session(agent=factories.agent_profile(team=factories.team("a")),
                             owner=factories.user(groups=["operators"], teams=["a"]))
    theirs = factories.session(agent=factories.agent_profile(team=factories.team("b")),
                               owner=factories.user(groups=["operators"], teams=["b"]))
    return ours, theirs, factories.user(groups=["operators"], teams=["a"])


def test_sessions_outside_the_users_teams_are_404_and_absent_from_lists() -> None:
    ours, theirs, op = _two_teams()
    client = api_client(op)
    assert client.get(f"/api/sessions/{ours.id}").status_code == 200
    response = client.get(f"/api/sessions/{theirs.id}")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert [s["id"] for s in client.get("/api/sessions").json()["items"]] == [str(ours.id)]
    for path in (f"/api/sessions/{theirs.id}/events", f"/api/sessions/{theirs.id}/turns",
                 f"/api/sessions/{theirs.id}/artifacts"):
        assert client.get(path).status_code == 404, path
    assert client.post(f"/api/sessions/{theirs.id}/turns", {"input": "read their files"},
                       content_type="application/json").status_code == 404
    assert client.post(f"/api/sessions/{theirs.id}/cancel").status_code == 404
    assert theirs.turns.count() == 0


def test_pages_and_overview_counts_are_scoped() -> None:
    ours, theirs, op = _two_teams()
    browser = login(op)
    assert browser.get(f"/sessions/{theirs.id}/").status_code == 404
    page = browser.get("/sessions/").content.decode()
    assert str(ours.id) in page and str(theirs.id) not in page
    overview = browser.get("/")
    assert overview.context["ov"].counts["idle"] == 1  # two idle sessions exist, one is ours


def test_the_owner_filter_lists_the_owners_of_the_users_teams_sessions_only() -> None:
    """The session list's owner choices: everyone owning a session of the user's teams, by name,
    each once; not an owner whose sessions are all in another team; every owner for a superuser."""
    from sessions_app.selectors import session_owners

    ours, theirs, op = _two_teams()
    zed = factories.user("zed", groups=["operators"], teams=["a"])
    factories.session(agent=ours.agent, owner=zed)
    factories.session(agent=ours.agent, owner=zed)
    names = [u.username for u in session_owners(user=op)]
    assert names == sorted([ours.owner.username, "zed"]) and theirs.owner.username not in names
    admin = factories.user("root", is_superuser=True, teams=[])
    assert [u.username for u in session_owners(user=admin)] == sorted(
        [ours.owner.username, theirs.owner.username, "zed"])
    assert session_owners(user=factories.user(groups=["operators"], teams=[])) == []


def test_approvals_of_other_teams_are_invisible_to_reviewers() -> None:
    tool_definitions_seed()
    _ours, theirs, _op = _two_teams()
    turn = factories.turn(theirs)
    step = factories.step(turn, tool_name="run_command", arguments={"command": "ls"}, approval_mode="mutating")
    approval = approval_services.approval_request_create(step_id=step.id)
    reviewer = factories.user(groups=["reviewers"], teams=["a"])
    client = api_client(reviewer)
    assert client.get("/api/approvals").json()["items"] == []
    assert client.get(f"/api/approvals/{approval.request_id}").status_code == 404
    response = client.post(f"/api/approvals/{approval.request_id}/decision",
                           {"decision": "approve", "arguments_sha256": approval.arguments_sha256},
                           content_type="application/json")
    assert response.status_code == 404
    assert login(reviewer).get(f"/approvals/{approval.request_id}/").status_code == 404
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_a_reviewer_only_member_cannot_operate_a_session_of_the_team() -> None:
    ours, _theirs, _op = _two_teams()
    # Global groups say operator; the team role says reviewer: the team role decides.
    user = factories.user(groups=["operators", "reviewers"], teams=["a"], role="reviewer")
    client = api_client(user)
    assert client.get(f"/api/sessions/{ours.id}").status_code == 200
    response = client.post(f"/api/sessions/{ours.id}/turns", {"input": "x"}, content_type="application/json")
    assert response.status_code == 403
    assert response.json()["code"] == "team_role_required"


def test_an_agent_of_another_team_cannot_start_a_session() -> None:
    _ours, theirs, op = _two_teams()
    response = api_client(op).post("/api/sessions", {"agent": theirs.agent.slug, "input": "hi"},
                                   content_type="application/json")
    assert response.status_code == 404
    assert AgentSession.objects.filter(agent=theirs.agent).count() == 1


def test_the_agent_a_session_starts_with_is_found_as_the_team_scope_says() -> None:
    """``agent_get`` (a query compiled once for members) agrees with the scope it writes out:
    an operator of the agent's team finds it, twice (the second time through the compiled SQL);
    a reviewer of that team, an operator of another team, an inactive user and an unknown slug
    do not; a superuser does."""
    ours, theirs, op = _two_teams()
    assert agent_get(ours.agent.slug, user=op) == ours.agent
    assert agent_get(ours.agent.slug, user=op) == ours.agent
    reviewer = factories.user(groups=["operators", "reviewers"], teams=["a"], role="reviewer")
    inactive = factories.user(groups=["operators"], teams=["a"], is_active=False)
    refused = [(theirs.agent.slug, op), (ours.agent.slug, reviewer), (ours.agent.slug, inactive), ("ghost", op)]
    for slug, user in refused:
        with pytest.raises(NotFound):
            agent_get(slug, user=user)
    admin = factories.user(groups=["admins"], teams=[], is_superuser=True, is_staff=True)
    assert agent_get(theirs.agent.slug, user=admin) == theirs.agent


def test_the_session_a_stream_watches_is_found_as_the_team_scope_says() -> None:
    """``session_exists`` (every WebSocket and SSE stream asks it at connect and on each re-check;
    a query compiled once for members) agrees with the scope: a member of the session's team finds
    it, twice (the second time through the compiled SQL), whatever their role; a member of another
    team, an inactive user, an unknown id and a malformed one do not; a superuser does."""
    ours, theirs, op = _two_teams()
    assert session_exists(ours.pk, user=op) and session_exists(str(ours.pk), user=op)
    reviewer = factories.user(groups=["reviewers"], teams=["a"], role="reviewer")
    assert session_exists(ours.pk, user=reviewer)
    inactive = factories.user(groups=["operators"], teams=["a"], is_active=False)
    refused = [(theirs.pk, op), (ours.pk, inactive), (uuid.uuid4(), op), ("not-a-uuid", op)]
    assert not any(session_exists(session_id, user=user) for session_id, user in refused)
    admin = factories.user(groups=["admins"], teams=[], is_superuser=True, is_staff=True)
    assert session_exists(theirs.pk, user=admin)


def test_admins_see_every_team() -> None:
    ours, theirs, _op = _two_teams()
    admin = factories.user(groups=["admins"], teams=[], is_superuser=True, is_staff=True)
    ids = {s["id"] for s in api_client(admin).get("/api/sessions").json()["items"]}
    assert ids == {str(ours.id), str(theirs.id)}


def test_agentops_user_creates_and_updates_with_roles_and_teams() -> None:
    factories.ensure_roles()
    factories.team("demo")
    factories.team("other")
    out = StringIO()
    call_command("agentops_user", "carol", "--roles", "operator,reviewer", "--teams", "demo,other",
                 "--password", "a-long-enough-passphrase", stdout=out)
    carol = User.objects.get(username="carol")
    assert carol.check_password("a-long-enough-passphrase")
    assert sorted(carol.groups.values_list("name", flat=True)) == ["operators", "reviewers"]
    assert dict(TeamMembership.objects.filter(user=carol).values_list("team__slug", "role")) == {
        "demo": "both", "other": "both"}
    call_command("agentops_user", "carol", "--roles", "reviewer", "--teams", "demo", stdout=out)
    assert dict(TeamMembership.objects.filter(user=carol).values_list("team__slug", "role")) == {"demo": "reviewer"}
    assert carol.check_password("a-long-enough-passphrase")  # unchanged without --password
    # The validators the README promises apply here too: "PW" made a superuser's password before.
    with pytest.raises(CommandError, match="The password is refused: This password is too short"):
        call_command("agentops_user", "root", "--roles", "admin", "--password", "PW", stdout=out)
    assert not User.objects.filter(username="root").exists()


@pytest.mark.parametrize(("roles", "teams", "message"), [
    ("operator,wizard", "demo", "Unknown role"),
    ("operator", "demo,nowhere", "Unknown team"),
])
def test_agentops_user_refuses_unknown_roles_and_teams(roles: str, teams: str, message: str) -> None:
    factories.ensure_roles()
    factories.team("demo")
    name = f"u{uuid.uuid4().hex[:6]}"
    with pytest.raises(CommandError, match=message):
        call_command("agentops_user", name, "--roles", roles, "--teams", teams, stdout=StringIO())
    assert not User.objects.filter(username=name).exists()


def test_the_demo_seed_puts_the_demo_users_and_agent_in_team_demo() -> None:
    factories.ensure_roles()
    call_command("agentops_demo", "--model-url", "http://127.0.0.1:9/v1", stdout=StringIO())
    call_command("agentops_demo", "--model-url", "http://127.0.0.1:9/v1", stdout=StringIO())  # idempotent
    roles = dict(TeamMembership.objects.filter(team__slug="demo").values_list("user__username", "role"))
    assert roles == {"admin": "both", "operator": "operator", "reviewer": "reviewer"}
    from sessions_app.models import AgentProfile

    assert AgentProfile.objects.get(slug="incident-responder").team.slug == "demo"
