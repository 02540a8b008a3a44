from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentops.domain import NotFound
from agentops.models import ApiToken
from agentops.services import SHOWN_PREFIX, api_token_create, api_tokens_revoke


class Command(BaseCommand):
    help = "Mint an API token for a user and print it once (only its hash is stored), or revoke one."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="A label to recognise the token by.")
        parser.add_argument("--revoke", metavar="PREFIX", default="",
                            help="Revoke the user's tokens that start with PREFIX (the token itself, or its first "
                                 "characters as the admin lists them), for good, instead of minting one.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["revoke"]:
            self._revoke(options["username"], options["revoke"])
            return
        try:
            row, token = api_token_create(username=options["username"], name=options["name"])
        except NotFound as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(token)
        self.stderr.write(f"Token {row.prefix}… for {row.user}. It is shown only now; store it safely.")

    def _revoke(self, username: str, prefix: str) -> None:
        if len(prefix) < 6:
            raise CommandError("--revoke needs at least the first 6 characters of the token")
        tokens = ApiToken.objects.filter(user__username=username, prefix__startswith=prefix[:SHOWN_PREFIX])
        if not tokens.exists():
            raise CommandError(f"{username!r} has no token starting with {prefix!r}")
        revoked = api_tokens_revoke(tokens)
        self.stderr.write(f"{revoked} token(s) of {username} revoked; {tokens.count() - revoked} already were.")
