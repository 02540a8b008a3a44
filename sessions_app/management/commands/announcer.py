"""`python manage.py announcer`: the process that renders and sends relayed live events."""

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand

from agentops.runtime import tune_gc
from sessions_app.relay import relay_run


class Command(BaseCommand):
    help = "Announce the events writers relay (sessions_app/relay.py) until SIGTERM/SIGINT."

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        self.stdout.write("announcer relaying live events")
        self.stdout.flush()
        tune_gc()
        relay_run(stop)
