"""Subagents at scale: a batch of N sessions, each spawning 2 subagents whose model call takes 2 s,
against the same-run floor of 3N independent sessions with one 2 s call each (the same number of
slow model calls, no parent waiting on children).

    python -m agentops.embedded_redis -- .venv/bin/python bench/subagents.py [--sessions 200] [--sleep-ms 2000]

Prints wall time ÷ ideal for both and their ratio. The ideal is one model call's time (every call
can overlap); the parent's own two calls answer at once. The real processes run: a Celery worker
subprocess and a model gateway subprocess (``_harness.Worker``), PostgreSQL, Redis.
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Worker, bench_agent, cleanup_workspaces, configure, start_model  # noqa: E402


def _wait_idle(session_ids: list[Any], timeout: float, worker: Worker) -> float:
    from sessions_app.models import Turn

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        worker.check()
        if not Turn.objects.filter(session_id__in=session_ids, status__in=Turn.ACTIVE).exists():
            return time.monotonic()
        time.sleep(0.2)
    raise SystemExit(f"not finished after {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--sleep-ms", type=int, default=2000)
    args = parser.parse_args()
    configure()
    from fanout_app.batches import batch_create
    from fanout_app.models import SubagentLink
    from fanout_app.services import spawn_tool_seed
    from sessions_app.models import AgentSession, Turn
    from tools_app.models import ToolDefinition

    server, url = start_model()
    spawn_tool_seed()
    agent, owner = bench_agent("bench-subagents", url)
    agent.tools.set(ToolDefinition.objects.all())
    worker = Worker(concurrency=8)
    worker.start()
    ideal = args.sleep_ms / 1000
    n = args.sessions
    try:
        time.sleep(3)  # the processes connect
        child = f"sleep {args.sleep_ms}\nsay checked"
        spawn = json.dumps({"tasks": [{"instructions": "Check A.", "input": child},
                                      {"instructions": "Check B.", "input": child}]})
        t0 = time.monotonic()
        floor, _ = batch_create(agent=agent, owner=owner, rows=[{"input": child}] * (3 * n),
                                title=f"floor {time.time()}")
        floor_ids = list(floor.members.values_list("session_id", flat=True))
        floor_wall = _wait_idle(floor_ids, 600, worker) - t0

        t0 = time.monotonic()
        parent = f"tool spawn_subagents {spawn}\nsay done"
        batch, _ = batch_create(agent=agent, owner=owner, rows=[{"input": parent}] * n,
                                title=f"subagents {time.time()}")
        parent_ids = list(batch.members.values_list("session_id", flat=True))
        while SubagentLink.objects.filter(parent_id__in=parent_ids).count() < 2 * n:
            worker.check()
            time.sleep(0.2)
        child_ids = list(SubagentLink.objects.filter(parent_id__in=parent_ids).values_list("child_id", flat=True))
        wall = _wait_idle(parent_ids + child_ids, 900, worker) - t0
        completed = Turn.objects.filter(session_id__in=parent_ids, status="completed").count()
        sessions = AgentSession.objects.filter(pk__in=parent_ids + child_ids).count()
        print(f"floor: {3 * n} independent sessions × 1 call of {ideal:.1f} s: wall {floor_wall:.1f} s = "
              f"{floor_wall / ideal:.2f}× ideal")
        print(f"subagents: {n} sessions × 2 subagents ({sessions} sessions, {completed}/{n} parents completed): "
              f"wall {wall:.1f} s = {wall / ideal:.2f}× ideal")
        print(f"subagents ÷ floor: {wall / floor_wall:.2f}")
    finally:
        worker.stop()
        server.shutdown()
        cleanup_workspaces()


if __name__ == "__main__":
    main()
