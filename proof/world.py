"""The people and the agent every proof drives the product with."""

PASSWORD = "proof-pass"
CLIENT_TOOL = "ask_operator"


def world_setup(slug: str, model_url: str) -> dict[str, str]:
    """Tools (a client tool among them), the agent ``slug`` on the scripted model, an operator and a
    reviewer (password PASSWORD); their API tokens by role. Call with Django set up."""
    from django.contrib.auth.models import Group, User

    from agentops.models import Team, TeamMembership, TeamRole
    from agentops.services import api_token_create
    from sessions_app.models import AgentProfile
    from tools_app.models import ToolDefinition
    from tools_app.services import tool_definitions_seed

    tool_definitions_seed()
    ToolDefinition.objects.update_or_create(
        name=CLIENT_TOOL, defaults={"kind": ToolDefinition.Kind.CLIENT, "description": "Ask the operator.",
                                    "approval_mode": "safe_readonly", "idempotent": True,
                                    "parameters_schema": {"type": "object",
                                                          "properties": {"question": {"type": "string"}},
                                                          "required": ["question"]}})
    # Commands and requests need a reviewer; a few retries each (the chaos interrupts them).
    ToolDefinition.objects.filter(name__in=["run_command", "http_request", "send_email"]).update(
        approval_mode="mutating")
    team = Team.objects.get_or_create(slug="proof", defaults={"name": "Proofs"})[0]
    agent, _ = AgentProfile.objects.update_or_create(
        slug=slug, defaults={"team": team, "name": slug.title(), "model": "scripted", "base_url": model_url,
                             "instructions": "You are a proof's agent.", "max_tool_calls": None,
                             "max_model_calls": None, "max_tokens": None, "max_wall_seconds": None})
    agent.tools.set(ToolDefinition.objects.all())
    users = {}
    for name, group in (("operator", "operators"), ("reviewer", "reviewers")):
        user, _ = User.objects.get_or_create(username=f"proof-{name}")
        user.set_password(PASSWORD)
        user.save()
        user.groups.add(*Group.objects.filter(name__in=[group, "operators"]))
        # Both start sessions; only the reviewer decides (four-eyes: never on their own requests).
        TeamMembership.objects.update_or_create(team=team, user=user, defaults={
            "role": TeamRole.BOTH if name == "reviewer" else TeamRole.OPERATOR})
        users[name] = api_token_create(username=user.username)[1]
    return users
