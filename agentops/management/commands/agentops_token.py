from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentops.domain import NotFound
from agentops.services import api_token_create


class Command(BaseCommand):
    help = "Mint an API token for a user and print it once (only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="A label to recognise the token by.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            row, token = api_token_create(username=options["username"], name=options["name"])
        except NotFound as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(token)
        self.stderr.write(f"Token {row.prefix}… for {row.user}. It is shown only now; store it safely.")
