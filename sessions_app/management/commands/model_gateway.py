"""`python manage.py model_gateway`: the asyncio process that makes the model calls."""

import asyncio
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agentops.runtime import open_files_raise, tune_gc
from sessions_app.engine.gateway import Gateway

FILES_BESIDES_CALLS = 100  # the gateway's other descriptors: its database pool, Redis, logs, the interpreter's


class Command(BaseCommand):
    help = "Run a model gateway until SIGTERM/SIGINT (then let the calls in flight finish)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--concurrency", type=int, default=None,
                            help="model calls in flight at once (default: $AGENTOPS_GATEWAY_CONCURRENCY, 500)")
        parser.add_argument("--db-threads", type=int, default=None,
                            help="threads for the database work (default: $AGENTOPS_GATEWAY_DB_THREADS, 8)")

    def handle(self, *args: Any, **options: Any) -> None:
        gateway = Gateway(concurrency=options["concurrency"], db_threads=options["db_threads"])
        files = open_files_raise()  # a socket per call in flight
        if 0 < files < gateway.concurrency + FILES_BESIDES_CALLS:
            fits = max(1, files - FILES_BESIDES_CALLS)
            self.stderr.write(f"model gateway: {gateway.concurrency} calls in flight need about "
                              f"{gateway.concurrency + FILES_BESIDES_CALLS} open files and this process may open "
                              f"{files}; making {fits} at once (raise the hard limit: systemd LimitNOFILE=, "
                              "ulimit -Hn)")
            gateway.concurrency = fits

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, gateway.stop)
            await gateway.run()

        self.stdout.write(f"model gateway {gateway.name} reading {gateway.concurrency} calls at once")
        self.stdout.flush()
        tune_gc()
        asyncio.run(main())
