"""Seed a benchmark's stack (run in the stack's own environment): the agent, its owner, a token.

Prints the API token on its last line.
"""

import os

import django


def seed() -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")
    os.environ.setdefault("AGENTOPS_DEMO", "1")  # a local benchmark: the development secret key is fine
    django.setup()
    from django.contrib.auth.models import Group, User

    from agentops.models import Team, TeamMembership
    from agentops.services import api_token_create
    from sessions_app.models import AgentProfile
    from tools_app.models import ToolDefinition
    from tools_app.services import tool_definitions_seed

    tool_definitions_seed()
    team = Team.objects.get_or_create(slug="bench", defaults={"name": "Benchmarks"})[0]
    agent, _ = AgentProfile.objects.update_or_create(
        slug="bench-concurrency",
        defaults={"team": team, "name": "bench concurrency", "model": "scripted", "base_url": os.environ["MODEL_URL"],
                  "instructions": "You are a benchmark agent.", "enabled": True, "max_tool_calls": None,
                  "max_model_calls": None, "max_tokens": None, "max_wall_seconds": None})
    agent.tools.set(ToolDefinition.objects.all())
    owner, _ = User.objects.get_or_create(username="bench-owner")
    owner.set_password(os.environ["PASSWORD"])
    owner.save()
    owner.groups.add(*Group.objects.filter(name__in=["operators", "reviewers"]))
    TeamMembership.objects.update_or_create(team=team, user=owner, defaults={"role": "both"})
    return api_token_create(username=owner.username)[1]
