"""`python manage.py scripted_model --port N`: the offline model server (see the scripted_model package)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from scripted_model.server import add_server_arguments, serve_from_arguments


class Command(BaseCommand):
    help = "Serve the deterministic OpenAI-compatible scripted model until killed."

    def add_arguments(self, parser: CommandParser) -> None:
        add_server_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        def announce(base_url: str) -> None:
            # Flushed: with `--port 0` this line is the only way a parent reading our pipe learns the port.
            self.stdout.write(f"scripted model listening on {base_url}")
            self.stdout.flush()

        serve_from_arguments(options, on_ready=announce)
