import os
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from agentops.models import Team, TeamMembership, TeamRole
from fanout_app.demo_airline import airline_agent_seed, airline_batch_start
from mcp_app.demo_seed import mcp_demo_tracker_ensure
from scripted_model.demo import DEMO_STARTER_FILES, DEMO_STATUS_SECRET, DEMO_STATUS_TOKEN_ENV
from sessions_app.models import AgentProfile
from tools_app.models import ToolDefinition
from tools_app.services import tool_definitions_seed
from vault_app.models import Secret
from vault_app.services import secret_create, secret_update

DEMO_USERS = [("admin", "admins", True), ("operator", "operators", False), ("reviewer", "reviewers", False)]
DEMO_INSTRUCTIONS = (
    "You are the on-call assistant for the payments platform. Investigate incidents from the logs in "
    "your workspace, propose the smallest safe remediation, verify it, and write a short incident report."
)


def _admin() -> User:
    return User.objects.get(username="admin")


class Command(BaseCommand):
    help = ("Create the team demo with the demo users (password = username, local use only), the tools and "
            "the demo agent profile.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model-url", default="", help="Base URL of the scripted model server.")
        parser.add_argument("--migrate", action="store_true",
                            help="Apply the migrations first (make run: one process start instead of two).")
        parser.add_argument("scenario", nargs="?", choices=["airline"],
                            help="Also start a scenario: airline = the rebooking desk's batch of cases.")

    def _seed_status_secret(self, team: Team) -> None:
        """The vault secret the demo's status API wants (its token comes from `make run`)."""
        token = os.environ.get(DEMO_STATUS_TOKEN_ENV, "")
        if not token:
            return
        existing = Secret.objects.filter(team=team, name=DEMO_STATUS_SECRET).first()
        if existing is None:
            secret_create(actor=_admin(), team_id=team.pk, name=DEMO_STATUS_SECRET, value=token,
                          allowed_tools=["http_request"],
                          description="Bearer token of the demo status API (scripted model server, /demo/status)")
        else:
            secret_update(actor=_admin(), secret_id=existing.pk, value=token)
        self.stdout.write(f"vault: secret {DEMO_STATUS_SECRET!r} of team {team.slug!r} (http_request only)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["migrate"]:
            call_command("migrate", interactive=False, verbosity=0)
        with transaction.atomic():
            profile = self._seed(options)
        # The incident tracker (an MCP server) is discovered outside the transaction: it runs a process.
        tracker = mcp_demo_tracker_ensure(team=profile.team)
        profile.tools.add(*tracker)
        self.stdout.write(f"demo incident tracker (MCP): {len(tracker)} tools")
        if options.get("scenario") == "airline":
            batch = airline_batch_start(owner=User.objects.get(username="operator"))
            self.stdout.write(f"airline batch started: /batches/{batch.id}/ ({batch.size} cases)")

    def _seed(self, options: dict[str, Any]) -> AgentProfile:
        tool_definitions_seed()
        team, _ = Team.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
        for username, group, is_admin in DEMO_USERS:
            user, created = User.objects.get_or_create(username=username, defaults={"is_staff": is_admin,
                                                                                   "is_superuser": is_admin})
            if created:
                user.set_password(username)
                user.save()
            user.groups.add(Group.objects.get(name=group))
            role = {"operators": TeamRole.OPERATOR, "reviewers": TeamRole.REVIEWER}.get(group, TeamRole.BOTH)
            TeamMembership.objects.get_or_create(team=team, user=user, defaults={"role": role})
        # A reviewer who is also an operator would be refused on their own sessions (self-approval).
        base_url, model = options["model_url"], "scripted-demo"
        if os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
            base_url, model = os.environ.get("OPENAI_BASE_URL", ""), os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
        profile, _ = AgentProfile.objects.update_or_create(
            slug="incident-responder",
            defaults={"name": "Incident responder", "team": team, "instructions": DEMO_INSTRUCTIONS,
                      "base_url": base_url,
                      "model": model, "starter_files": DEMO_STARTER_FILES, "max_tool_calls": 50,
                      "max_tokens": 200_000, "max_wall_seconds": 3600},
        )
        profile.tools.set(ToolDefinition.objects.filter(kind="builtin", enabled=True)
                          .exclude(name__in=["search_flights", "hold_seats", "rebook_passengers", "spawn_subagents"]))
        self._seed_status_secret(team)
        self.stdout.write(f"demo agent {profile.slug!r} uses {base_url or 'the default OpenAI endpoint'} ({model})")
        desk = airline_agent_seed(team=team, base_url=base_url, model=model)
        self.stdout.write(f"demo agent {desk.slug!r} (airline rebooking desk, subagents)")
        return profile
