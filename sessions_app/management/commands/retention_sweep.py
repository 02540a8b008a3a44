"""`python manage.py retention_sweep [--dry-run]`: remove stale workspaces, expire idempotency records."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from sessions_app.retention import retention_sweep


class Command(BaseCommand):
    help = ("Remove the workspaces of sessions at rest for AGENTOPS_WORKSPACE_TTL_HOURS (artifacts stay) and "
            "delete idempotency records older than AGENTOPS_IDEMPOTENCY_TTL_HOURS.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Count what would go; change nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        counts = retention_sweep(dry_run=options["dry_run"])
        verb = "would remove" if options["dry_run"] else "removed"
        self.stdout.write(f"{verb} {counts['workspaces_removed']} workspace(s) and "
                          f"{counts['idempotency_records_deleted']} idempotency record(s)")
