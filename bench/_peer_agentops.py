"""bench/peers.py child in the project's .venv: agentops's engine (``--system agentops``) or the
Django ORM floor (``--system django``).

agentops: the real engine path of bench/engine_overhead.py: ``session_start`` → a real Celery
worker subprocess (threads pool, queues engine/sandbox) and the model gateway subprocess → turn
completed, timed from session_start to ``Turn.finished_at`` and checked (N tool steps, N + 1 model
steps, answer "done"). The agent has only the ``list_files`` tool, like the peers. Its Redis is the
one in REDIS_URL (bench/peers.py starts this child under ``agentops.embedded_redis``).

django: the psycopg floor's loop and rows (bench/_peer_psycopg.py) written through the Django ORM:
per tool step ``transaction.atomic()`` around ``create()`` of the step, ``create()`` of 2 events and
an ``update()`` of the turn's counter.
"""

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _peers_common import (  # noqa: E402
    Turn,
    floor_loop,
    floor_tables,
    script,
    serve,
    timed,
    versions,
)

TURN_BUDGET_SECONDS = 300.0


def setup(args: argparse.Namespace) -> tuple[Turn, Callable[[], None], str, dict[str, str]]:
    os.environ["DATABASE_URL"] = args.dsn
    os.environ["BENCH_DATABASE_NAME"] = urlsplit(args.dsn).path.lstrip("/")
    from _harness import configure

    configure()
    if args.system == "agentops":
        return _agentops(args)
    return _django(args)


def _agentops(args: argparse.Namespace) -> tuple[Turn, Callable[[], None], str, dict[str, str]]:
    from _harness import Worker, bench_agent, cleanup_workspaces
    from engine_overhead import run_engine

    from tools_app.models import ToolDefinition

    profile, owner = bench_agent("bench-peers", args.model_url)
    profile.tools.set(ToolDefinition.objects.filter(name="list_files"))
    worker = Worker()
    worker.start()

    def turn(n: int) -> dict[str, Any]:
        driver_cpu = time.process_time()
        ms, finished = run_engine(profile, owner, n, worker, time.monotonic() + TURN_BUDGET_SECONDS)
        if not finished:
            raise RuntimeError(f"the engine's turn N={n} did not finish in time:\n{worker.tail()}")
        # This process only starts the turn and polls for its end every 20 ms: its CPU is the
        # benchmark's, not the engine's (session_start's own share is a few ms per turn).
        return {"ms": ms, "tool_calls": n, "exclude_cpu_ms": (time.process_time() - driver_cpu) * 1000}

    def teardown() -> None:
        worker.stop()
        cleanup_workspaces()

    about = ("session_start → turn completed through the real worker (Celery, threads -c 4) and model gateway"
             " (asyncio) processes, Redis embedded; streamed model calls")
    return turn, teardown, about, versions("django", "celery", "openai", "psycopg")


def _django(args: argparse.Namespace) -> tuple[Turn, Callable[[], None], str, dict[str, str]]:
    import openai
    from django.db import connection, models, transaction
    from django.db.models import F
    from django.utils import timezone

    floor_tables(args.dsn, "peers_dj_")

    class FloorTurn(models.Model):
        objects: Any = models.Manager()
        input = models.TextField()
        tool_calls = models.IntegerField(default=0)
        created_at = models.DateTimeField(default=timezone.now)
        class Meta:
            app_label = "sessions_app"
            managed = False
            db_table = "peers_dj_turn"

    class FloorStep(models.Model):
        objects: Any = models.Manager()
        turn = models.ForeignKey(FloorTurn, on_delete=models.CASCADE, db_constraint=False)
        index = models.IntegerField()
        tool_name = models.TextField()
        call_id = models.TextField()
        arguments = models.JSONField()
        result = models.JSONField()
        created_at = models.DateTimeField()
        class Meta:
            app_label = "sessions_app"
            managed = False
            db_table = "peers_dj_step"

    class FloorEvent(models.Model):
        objects: Any = models.Manager()
        turn = models.ForeignKey(FloorTurn, on_delete=models.CASCADE, db_constraint=False)
        seq = models.IntegerField()
        type = models.TextField()
        payload = models.JSONField()
        created_at = models.DateTimeField()
        class Meta:
            app_label = "sessions_app"
            managed = False
            db_table = "peers_dj_event"

    client = openai.OpenAI(base_url=args.model_url, api_key="not-needed", max_retries=0, timeout=60)

    def run(n: int) -> tuple[int, Any]:
        user = script(n)
        turn = FloorTurn.objects.create(input=user)

        def record(index: int, call: dict[str, Any], arguments: dict[str, Any], output: str) -> None:
            now = timezone.now()
            with transaction.atomic():
                FloorStep.objects.create(turn=turn, index=index, tool_name=call["function"]["name"],
                                         call_id=call["id"], arguments=arguments, result={"output": output},
                                         created_at=now)
                for seq, (kind, payload) in enumerate((("tool.started", {"arguments": arguments}),
                                                       ("tool.completed", {"output": output}))):
                    FloorEvent.objects.create(turn=turn, seq=2 * index + seq, type=kind, payload=payload,
                                              created_at=now)
                FloorTurn.objects.filter(pk=turn.pk).update(tool_calls=F("tool_calls") + 1)

        return floor_loop(client, user, record)

    def teardown() -> None:
        client.close()
        connection.close()

    about = ("the psycopg floor's loop and rows through the Django ORM: per tool step atomic() { create step,"
             " 2 × create event, update turn }")
    return timed(run), teardown, about, versions("django", "psycopg", "openai")


if __name__ == "__main__":
    serve(setup)
