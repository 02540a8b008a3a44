from typing import Any

from django.core.management.base import BaseCommand

from vault_app.services import secrets_rotate


class Command(BaseCommand):
    help = ("Re-encrypt every secret with the first key of AGENTOPS_SECRET_KEYS (the others still decrypt "
            "meanwhile: no downtime). Then the old keys can be dropped.")

    def handle(self, *args: Any, **options: Any) -> None:
        counts = secrets_rotate()
        self.stdout.write(f"vault: {counts['rotated']} secret(s) re-encrypted with the first key, "
                          f"{counts['current']} already under it; {counts['retired_rotated']} retired value(s) "
                          "(still redacted) re-encrypted")
