"""Engine overhead per tool step against two floors measured in the same run.

Usage: .venv/bin/python bench/engine_overhead.py [N ...]     (default: 50 200 400)
Env:   DATABASE_URL (only its server is used: the benchmark works in its own database
       BENCH_DATABASE_NAME, default bench_agentops), REDIS_URL (default redis://127.0.0.1:6379/9).

A turn whose scripted model asks for N ``list_files`` calls, one per reply, then says "done"
(N + 1 model calls, N tool steps) runs through the real engine: session_start → a real Celery
worker subprocess (threads pool, queues engine/llm/sandbox) → turn completed, on PostgreSQL.
Floors, measured in one plain loop in this process (same N + 1 model calls over HTTP through the
openai SDK with the same growing history, kept in memory):
  floor b  the whole loop: model call + execute_tool("list_files") + per step one Step row and two
           Event rows (event_record, announced after commit) and one ORM update, in two
           transactions (running, then the result);
  floor a  the unavoidable work: the same loop less its time in those DB writes.
Targets (issue 4): engine − floor a ≤ 5 ms per step, and flat in N.
"""

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Worker, bench_agent, cleanup_workspaces, configure, start_model  # noqa: E402

DEFAULT_NS = (50, 200, 400)
WARMUP_N = 10
TURN_TIMEOUT_SECONDS = 150.0
RUN_BUDGET_SECONDS = 270.0  # the whole benchmark stays under 5 minutes: past this, rows are marked partial


def script(n: int) -> str:
    return "\n".join(['tool list_files {"path": "."}'] * n + ["say done"])


def main() -> None:
    ns = tuple(int(a) for a in sys.argv[1:]) or DEFAULT_NS
    config = configure()
    server, model_url = start_model()
    worker = Worker()
    ok = False
    try:
        worker.start()
        _bench(ns, config, model_url, worker)
        ok = True
    finally:
        worker.stop(keep_log=not ok)
        server.shutdown()
        server.server_close()
        cleanup_workspaces()


def run_engine(profile: Any, owner: Any, n: int, worker: Worker, deadline: float) -> tuple[float, bool]:
    """Wall ms from session_start to the turn's finished_at (same host clock), checked for correctness.

    A turn still running after TURN_TIMEOUT_SECONDS or past ``deadline`` is cancelled; its time is then a
    lower bound (False).
    """
    from sessions_app.engine.commands import session_cancel, session_start
    from sessions_app.models import Step, Turn

    started = time.time()
    _, turn = session_start(agent=profile, owner=owner, input=script(n), title=f"bench N={n}")
    assert turn is not None
    deadline = min(deadline, time.monotonic() + TURN_TIMEOUT_SECONDS)
    while True:
        status, finished_at, output = Turn.objects.filter(pk=turn.pk).values_list(
            "status", "finished_at", "output_text").get()
        if status not in Turn.ACTIVE:
            break
        if time.monotonic() > deadline:
            session_cancel(session_id=turn.session_id)
            return (time.time() - started) * 1000, False
        worker.check()
        time.sleep(0.02)
    tools = Step.objects.filter(turn=turn, kind=Step.Kind.TOOL, status=Step.Status.COMPLETED).count()
    models = Step.objects.filter(turn=turn, kind=Step.Kind.MODEL, status=Step.Status.COMPLETED).count()
    if status != Turn.Status.COMPLETED or output != "done" or tools != n or models != n + 1 or finished_at is None:
        raise SystemExit(f"turn N={n} ended {status} output={output!r} tool steps={tools} model steps={models};\n"
                         + worker.tail())
    return (finished_at.timestamp() - started) * 1000, True


def run_floor(profile: Any, owner: Any, n: int, deadline: float) -> tuple[float, float, int]:
    """The same conversation without the engine: N + 1 streamed model calls and N list_files calls,
    each step also writing its Step row, two Events and one update (two transactions).

    Returns (floor a ms, floor b ms, steps done): floor b is the whole loop, floor a the same loop
    less the time spent in the DB writes. Stops early (steps done < N) past ``deadline``.
    """
    import openai
    from django.db import transaction
    from django.utils import timezone

    from sessions_app.engine.llm import tools_param
    from sessions_app.engine.prompt import system_prompt
    from sessions_app.events import event_record
    from sessions_app.models import Step
    from sessions_app.services import session_create, turn_create
    from tools_app.builtin import execute_tool
    from tools_app.sandbox import workspace_for

    session = session_create(agent=profile, owner=owner, title=f"bench floor N={n}")
    turn = turn_create(session_id=session.id, input=script(n))
    workspace = workspace_for(session.id)
    client = openai.OpenAI(base_url=profile.base_url, api_key="not-needed", max_retries=0, timeout=60)
    started = time.perf_counter()
    in_db = 0.0
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(session)},
                                      {"role": "user", "content": turn.input}]
    tools = tools_param(profile)
    done = 0
    while time.monotonic() < deadline:
        content, calls = _stream(client, messages, tools)
        if not calls:
            if done != n or content != "done":
                raise SystemExit(f"floor N={n} made {done} calls and ended with {content!r}")
            break
        messages.append({"role": "assistant", "content": content or None,
                         "tool_calls": [{"id": c["id"], "type": "function",
                                         "function": {"name": c["name"], "arguments": c["arguments"]}}
                                        for c in calls]})
        for call in calls:
            db_started = time.perf_counter()
            with transaction.atomic():
                step = Step.objects.create(session=session, turn=turn, index=done, kind=Step.Kind.TOOL,
                                           tool_name=call["name"], call_id=call["id"],
                                           arguments=json.loads(call["arguments"] or "{}"),
                                           status=Step.Status.RUNNING, started_at=timezone.now())
                event_record(session_id=session.id, turn_id=turn.id, step_id=step.id, type="tool.started",
                             payload={"tool": call["name"], "arguments": call["arguments"]})
            in_db += time.perf_counter() - db_started
            result = execute_tool(name=call["name"], workspace=workspace, arguments=call["arguments"])
            db_started = time.perf_counter()
            with transaction.atomic():
                Step.objects.filter(pk=step.pk).update(status=Step.Status.COMPLETED, result=result.to_dict(),
                                                       finished_at=timezone.now())
                event_record(session_id=session.id, turn_id=turn.id, step_id=step.id, type="tool.completed",
                             payload={"result": {"status": result.status, "output": result.output}})
            in_db += time.perf_counter() - db_started
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result.output})
            done += 1
    total = (time.perf_counter() - started) * 1000
    return total - in_db * 1000, total, done


def _stream(client: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> tuple[str, list[Any]]:
    """One streamed chat completion through the same SDK transport as the engine, assembled the same way."""
    import openai
    from openai.types.chat import ChatCompletion

    from sessions_app.engine.llm import ModelReply, chunk_fold

    body = {"model": "scripted", "messages": messages, "tools": tools, "stream": True,
            "stream_options": {"include_usage": True}}
    stream = client.post("/chat/completions", body=body, cast_to=ChatCompletion, stream=True,
                         stream_cls=openai.Stream[object])
    reply = ModelReply()
    calls: dict[int, dict[str, str]] = {}
    for chunk in stream:
        chunk_fold(reply, calls, chunk)
    return reply.content, [calls[i] for i in sorted(calls)]


def _bench(ns: tuple[int, ...], config: dict[str, str], model_url: str, worker: Worker) -> None:
    import django

    deadline = time.monotonic() + RUN_BUDGET_SECONDS
    profile, owner = bench_agent("bench-engine-overhead", model_url)
    print("engine overhead per tool step (issue 4)")
    print(f"  database   {config['database']} (PostgreSQL)")
    print(f"  redis      {config['redis']}")
    print(f"  worker     {' '.join(worker.command[1:])}")
    print(f"  model      scripted, zero latency, {model_url} (thread in this process), openai SDK, streamed")
    print('  script     N × tool list_files {"path": "."} then say done (N+1 model calls, N tool steps)')
    print("  engine     session_start → turn completed (Turn.finished_at), through the worker")
    print("  floor b    one loop: model call (the engine's openai SDK transport, same growing history)")
    print("             + execute_tool(list_files)")
    print("             + per step 1 Step row, 2 event_record() (announced), 1 ORM update, in 2 transactions")
    print("  floor a    the same loop less its time in those DB writes (the unavoidable work)")
    print(f"  python {sys.version.split()[0]}, django {django.get_version()}, {os.cpu_count()} CPUs")
    print(f"  warm-up    one turn of N={WARMUP_N} through the engine and the floor (not counted)", flush=True)
    if not run_engine(profile, owner, WARMUP_N, worker, deadline)[1]:
        raise SystemExit("the warm-up turn did not finish; see the worker log:\n" + worker.tail())
    run_floor(profile, owner, WARMUP_N, deadline)

    rows: dict[int, tuple[float, float, float]] = {}
    partial: set[int] = set()
    for n in ns:
        engine_ms, finished = run_engine(profile, owner, n, worker, deadline)
        if not finished:
            partial.add(n)
            print(f"  N={n}: the engine's turn was not done in time; cancelled (ms/step is a lower bound)", flush=True)
        floor_a, floor_b, done = run_floor(profile, owner, n, deadline)
        if done < n:
            partial.add(n)
            print(f"  N={n}: the floor stopped at the time budget after {done} steps", flush=True)
        rows[n] = (engine_ms / n, floor_a / max(done, 1), floor_b / max(done, 1))
        print(f"  done N={n}: engine {rows[n][0]:.2f} ms/step", flush=True)

    print()
    print(f"{'N':>5} | {'engine':>8} | {'floor a':>8} | {'floor b':>8} | {'engine-a':>8} | {'engine/b':>8}"
          f" | {'engine/a':>8}")
    print(f"{'':>5} | {'ms/step':>8} | {'ms/step':>8} | {'ms/step':>8} | {'ms/step':>8} | {'ratio':>8} | {'ratio':>8}")
    for n, (engine, floor_a, floor_b) in rows.items():
        mark = " (partial: over the time budget)" if n in partial else ""
        print(f"{n:>5} | {engine:8.2f} | {floor_a:8.2f} | {floor_b:8.2f} | {engine - floor_a:8.2f} | "
              f"{engine / floor_b:7.2f}x | {engine / floor_a:7.2f}x{mark}")
    lo, hi = min(ns), max(ns)
    if lo != hi:
        growth = [rows[hi][i] / rows[lo][i] for i in range(3)]
        print(f"growth of ms/step, N={hi} vs N={lo}: engine {growth[0]:.2f}x, floor a {growth[1]:.2f}x, "
              f"floor b {growth[2]:.2f}x (flat = 1.00x)")
        overhead = [rows[n][0] - rows[n][1] for n in (lo, hi)]
        print(f"growth of the overhead (engine − floor a), N={hi} vs N={lo}: {overhead[1] / overhead[0]:.2f}x")
    worst = max(engine - floor_a for engine, floor_a, _ in rows.values())
    print(f"overhead above the work (engine − floor a), worst N: {worst:.2f} ms/step (target ≤ 5 ms, flat in N)")


if __name__ == "__main__":
    main()
