"""Create or update a user for scripts: roles (groups) and team memberships in one command."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentops.domain import DomainError
from agentops.services import user_provision


class Command(BaseCommand):
    help = ("Create or update a user: agentops_user NAME --roles operator,reviewer --teams demo,other "
            "--password PW. Unknown roles or teams are an error.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--roles", default="", help="Comma-separated: operator, reviewer, admin.")
        parser.add_argument("--teams", default="", help="Comma-separated team slugs (the teams must exist).")
        parser.add_argument("--password", default=None, help="Set this password (else unchanged / unusable).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            user, created = user_provision(username=options["username"], roles=_split(options["roles"]),
                                           teams=_split(options["teams"]), password=options["password"])
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        memberships = ", ".join(f"{m.team.slug}:{m.role}" for m in user.team_memberships.select_related("team"))
        self.stdout.write(f"{'created' if created else 'updated'} {user.username} "
                          f"(groups: {', '.join(sorted(g.name for g in user.groups.all())) or '-'}; "
                          f"teams: {memberships or '-'})")


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]
