"""The airline rebooking desk demo: its agent profile and the batch of difficult cases.

Seeded by ``manage.py agentops_demo`` (``make run``) beside the incident responder; the batch is
started by ``manage.py agentops_demo airline`` or from the Batches page (paste ``AIRLINE_CASES``).
With no model configured the scripted model plays it (``scripted_model/scenarios_airline.py``);
with ``OPENAI_API_KEY`` set the same agent and tools work with a real model.
"""

from django.contrib.auth.models import User

from agentops.models import Team
from fanout_app.batches import batch_create
from fanout_app.models import Batch
from fanout_app.services import spawn_tool_seed
from scripted_model.scenarios_airline import AIRLINE_CASES, AIRLINE_INSTRUCTIONS, AIRLINE_STARTER_FILES
from sessions_app.models import AgentProfile
from tools_app.models import ToolDefinition

AIRLINE_AGENT = "rebooking-desk"
AIRLINE_TOOLS = ("search_flights", "hold_seats", "rebook_passengers", "read_file", "list_files", "write_file",
                 "run_command", "publish_artifact", "spawn_subagents")


def airline_agent_seed(*, team: Team, base_url: str, model: str) -> AgentProfile:
    """The "Rebooking desk" agent (idempotent: updated in place)."""
    spawn_tool_seed()
    profile, _ = AgentProfile.objects.update_or_create(
        slug=AIRLINE_AGENT,
        defaults={"name": "Rebooking desk", "team": team, "instructions": AIRLINE_INSTRUCTIONS, "base_url": base_url,
                  "model": model, "starter_files": AIRLINE_STARTER_FILES, "max_tool_calls": 60,
                  "max_tokens": 400_000, "max_wall_seconds": 3600})
    profile.tools.set(ToolDefinition.objects.filter(name__in=AIRLINE_TOOLS))
    return profile


def airline_batch_start(*, owner: User) -> Batch:
    """One session per difficult case, in parallel (a batch)."""
    agent = AgentProfile.objects.get(slug=AIRLINE_AGENT)
    batch, _created = batch_create(agent=agent, owner=owner, rows=list(AIRLINE_CASES),
                                   title="UA 100 cancelled: rebooking desk")
    return batch
