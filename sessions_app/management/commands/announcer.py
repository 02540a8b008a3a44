"""`python manage.py announcer [--shard K]`: a process that renders and sends relayed live events."""

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentops.runtime import tune_gc
from sessions_app import fragments
from sessions_app.announce import relay_shards
from sessions_app.relay import relay_run


class Command(BaseCommand):
    help = ("Announce the events writers relay (sessions_app/relay.py) until SIGTERM/SIGINT: those of the "
            "sessions of one shard when AGENTOPS_ANNOUNCERS > 1.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--shard", type=int, default=0,
                            help="which of the AGENTOPS_ANNOUNCERS shards of the sessions (0 to n-1; default 0)")

    def handle(self, *args: Any, **options: Any) -> None:
        shard, shards = options["shard"], relay_shards()
        if not 0 <= shard < shards:
            raise CommandError(f"--shard must be from 0 to {shards - 1} (AGENTOPS_ANNOUNCERS={shards}), not {shard}.")
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        self.stdout.write(f"announcer relaying live events (shard {shard} of {shards})")
        self.stdout.flush()
        try:
            fragments.warm_up()
        except Exception:  # a database not there yet: the first batch compiles what it needs
            logging.getLogger(__name__).warning("announcer: warming up failed", exc_info=True)
        tune_gc()
        relay_run(stop, shard)
