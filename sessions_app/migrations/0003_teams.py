"""Agents and sessions belong to a team; existing rows go to the team ``default``, and every
existing user joins it with the role their groups give (so nobody loses what they saw)."""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models


def to_default_team(apps: Any, schema_editor: Any) -> None:
    Team = apps.get_model("agentops", "Team")
    AgentProfile = apps.get_model("sessions_app", "AgentProfile")
    AgentSession = apps.get_model("sessions_app", "AgentSession")
    if not AgentProfile.objects.exists():
        return  # a fresh install: teams are made by the admin, agentops_user or the demo
    team, _ = Team.objects.get_or_create(slug="default", defaults={"name": "Default"})
    AgentProfile.objects.filter(team__isnull=True).update(team=team)
    AgentSession.objects.filter(team__isnull=True).update(team=team)
    User = apps.get_model("auth", "User")
    Membership = apps.get_model("agentops", "TeamMembership")
    for user in User.objects.prefetch_related("groups"):
        names = {g.name for g in user.groups.all()}
        operator, reviewer = bool(names & {"operators", "admins"}), bool(names & {"reviewers", "admins"})
        role = "both" if operator and reviewer else "reviewer" if reviewer else "operator"
        Membership.objects.get_or_create(team=team, user=user, defaults={"role": role})


class Migration(migrations.Migration):
    dependencies = [
        ("agentops", "0004_teams"),
        ("agentops", "0002_roles"),
        ("sessions_app", "0002_drop_redundant_fk_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentprofile", name="team",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name="agents",
                                    to="agentops.team"),
        ),
        migrations.AddField(
            model_name="agentsession", name="team",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name="sessions",
                                    to="agentops.team"),
        ),
        migrations.RunPython(to_default_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="agentprofile", name="team",
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="agents",
                                    to="agentops.team"),
        ),
        migrations.AlterField(
            model_name="agentsession", name="team",
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="sessions",
                                    to="agentops.team"),
        ),
    ]
