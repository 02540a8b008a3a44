"""The admin is scoped to the user's teams for staff who are not superusers (``agentops/admin_teams.py``)."""

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, Permission

from agentops.admin_teams import SUPERUSER_ONLY, TEAM_PATHS
from sessions_app.models import AgentSession
from tests import factories
from tests.helpers import login

pytestmark = pytest.mark.django_db


def _team_staff() -> object:
    """A staff member of team acme with every permission of the admins group, not a superuser."""
    factories.ensure_roles()
    staff = factories.user("acme-admin", teams=["acme"], role="both", is_staff=True)
    staff.groups.add(Group.objects.get(name="admins"))
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_user", "view_outbox"]))
    return staff


def test_team_staff_see_and_pick_only_their_teams_rows_in_the_admin() -> None:
    acme, other = factories.team("acme"), factories.team("globex")
    mine = factories.session(agent=factories.agent_profile(team=acme, name="Acme agent"), title="acme case")
    theirs = factories.session(agent=factories.agent_profile(team=other, name="Globex agent"), title="globex case")
    client = login(_team_staff())  # type: ignore[arg-type]

    listing = client.get("/admin/sessions_app/agentsession/")
    assert listing.status_code == 200
    assert "acme case" in listing.text and "globex case" not in listing.text
    assert client.get(f"/admin/sessions_app/agentsession/{mine.pk}/change/").status_code == 200
    # Another team's row is "not found" (the admin's redirect to its index), never shown.
    hidden = client.get(f"/admin/sessions_app/agentsession/{theirs.pk}/change/")
    assert hidden.status_code == 302 and "globex" not in hidden.text
    events = client.get("/admin/sessions_app/event/").text
    assert "acme case" in events and "globex case" not in events

    form = client.get("/admin/sessions_app/agentprofile/add/").text
    team_choices = form[form.index('<select name="team"'):].split("</select>", 1)[0]
    assert f'<option value="{acme.pk}"' in team_choices and f'<option value="{other.pk}"' not in team_choices
    # What belongs to no team is the superusers' (the permissions alone do not open it).
    assert client.get("/admin/auth/user/").status_code == 403
    assert client.get("/admin/tools_app/outbox/").status_code == 403

    root = login(factories.user("root", is_staff=True, is_superuser=True))
    everything = root.get("/admin/sessions_app/agentsession/").text
    assert "acme case" in everything and "globex case" in everything
    assert AgentSession.objects.count() == 2


def test_every_model_in_the_admin_has_a_team_scope() -> None:
    """A new ModelAdmin must say how its rows reach a team (or be for superusers only): the check
    at start refuses one that does not, and this lists them."""
    assert {model._meta.label for model in admin.site._registry} <= {*TEAM_PATHS, *SUPERUSER_ONLY}
