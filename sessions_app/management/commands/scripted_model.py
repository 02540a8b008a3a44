"""`python manage.py scripted_model --port N`: the offline model server (see the scripted_model package)."""

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from scripted_model.server import DEFAULT_PORT, serve


class Command(BaseCommand):
    help = "Serve the deterministic OpenAI-compatible scripted model until killed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=DEFAULT_PORT)
        parser.add_argument(
            "--api-key",
            default=os.environ.get("SCRIPTED_MODEL_API_KEY") or None,
            help="reject other bearer keys with 401 (default: $SCRIPTED_MODEL_API_KEY; unset accepts any key)",
        )
        parser.add_argument("--quiet", action="store_true", help="do not log each request")

    def handle(self, *args: Any, **options: Any) -> None:
        def announce(base_url: str) -> None:
            # Flushed: `make run` and the e2e tests wait for this line on a pipe before connecting.
            self.stdout.write(f"scripted model listening on {base_url}")
            self.stdout.flush()

        serve(
            options["host"], options["port"], options["api_key"], on_ready=announce, log_requests=not options["quiet"]
        )
