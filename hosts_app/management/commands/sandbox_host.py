"""`python manage.py sandbox_host --name NAME [--pool P] [--labels a,b] [--capacity N]`: this
machine becomes sandbox host NAME, a Celery worker on the queue ``sandbox.NAME`` that registers
itself and heartbeats. The one command to run per sandbox machine (README "Several machines")."""

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Run this machine as a sandbox host: a Celery worker on sandbox.<name> that registers and heartbeats."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", required=True)
        parser.add_argument("--pool", default="default")
        parser.add_argument("--labels", default="", help="comma-separated")
        parser.add_argument("--capacity", type=int, default=8)
        parser.add_argument("--concurrency", type=int, default=8)

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        env = {**os.environ, "AGENTOPS_SANDBOX_HOST": name, "AGENTOPS_SANDBOX_HOST_POOL": options["pool"],
               "AGENTOPS_SANDBOX_HOST_LABELS": options["labels"],
               "AGENTOPS_SANDBOX_HOST_CAPACITY": str(options["capacity"])}
        argv = [sys.executable, "-m", "celery", "-A", "agentops", "worker", "-Q", f"sandbox.{name}",
                "-n", f"{name}@%h", "--pool", "threads", "--concurrency", str(options["concurrency"]),
                "-l", "warning"]
        os.execvpe(argv[0], argv, env)
