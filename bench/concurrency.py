"""Many sessions at once: wall time against the ideal, through the product's real processes (issue 10).

Each session: 6 model calls that take 2 s each (scripted ``sleep 2000``), one read-only tool call
(``list_files``) between calls; ideal = 12 s. Sessions are started through the JSON API by 32
concurrent clients. Printed per layout and N: wall ÷ ideal, p50/p99 session completion, errors,
duplicate model calls (the scripted model's request log), peak PostgreSQL connections
(``pg_stat_activity``), peak calls in flight (at the model), CPU per step of the product's
processes; with WebSocket watchers on the N = 300 run (``--watch-at``): push latency and losses.
In the same run: the plain-asyncio floor (one process, the same model and calls, no durability).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/9 \\
        .venv/bin/python bench/concurrency.py [--layout multi make-run] [--sessions 100 300 1000]
"""

import argparse
import asyncio
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import _harness
import _push
import _stack
from _harness import pct

CALLS, SLEEP_MS = 6, 2000
IDEAL = CALLS * SLEEP_MS / 1000
CLIENTS = 32
STEPS_PER_SESSION = CALLS + (CALLS - 1)
PASSWORD = "bench-pass"


def session_script(token: str) -> str:
    lines = [f"bench {token}"]  # prose: the script parser skips it; the request log shows it first
    for n in range(CALLS):
        lines.append(f"sleep {SLEEP_MS}")
        lines.append('tool list_files {"path": "."}' if n < CALLS - 1 else f"say done {token}")
    return "\n".join(lines)


class Sampler(threading.Thread):
    """Every 0.25 s: PostgreSQL connections of the product, calls in flight at the model."""

    def __init__(self, stack: _stack.Stack, database: str | None) -> None:
        super().__init__(daemon=True)
        self.stack, self.database = stack, database
        self.peak_connections = 0
        self.peak_in_flight = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        conn = None
        if self.database:
            import psycopg

            conn = psycopg.connect(self.database.replace("postgres://", "postgresql://", 1), autocommit=True)
        while not self.stopping.is_set():
            try:
                if conn is not None:
                    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                       [_stack.APP_NAME]).fetchone()
                    self.peak_connections = max(self.peak_connections, int(row[0]) if row else 0)
                self.peak_in_flight = max(self.peak_in_flight, int(self.stack.model_stats()["in_flight"]))
            except Exception as exc:
                print(f"  (sampler: {exc})", file=sys.stderr)
            self.stopping.wait(0.25)
        if conn is not None:
            conn.close()


def cpu_by_pid(by_name: dict[str, list[Any]]) -> dict[int, float]:
    return {p.pid: cpu_seconds([p]) for procs in by_name.values() for p in procs}


def cpu_split_since(stack: _stack.Stack, before: dict[int, float]) -> dict[str, float]:
    """CPU seconds per role since ``before`` (``cpu_by_pid``): the processes running now, those that
    started meanwhile counted whole (PostgreSQL's backends for the pools' new connections, most of
    them: counting only the processes seen at the start missed their CPU)."""
    return {name: round(sum(cpu_seconds([p]) - before.get(p.pid, 0.0) for p in procs), 1)
            for name, procs in stack.processes_by_name().items()}


def cpu_seconds(processes: list[Any]) -> float:
    total = 0.0
    for p in processes:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:
            continue
    return total


def start_watchers(stack: _stack.Stack, per_session: int, seconds: float) -> subprocess.Popen[str]:
    url = f"http://127.0.0.1:{stack.live_port}" if stack.live_port else stack.url
    proc = subprocess.Popen([sys.executable, str(_stack.BENCH_DIR / "_watchers.py"), url, "bench-owner",
                             PASSWORD, str(per_session), str(seconds)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        raise SystemExit(f"the watchers did not start: {line!r}")
    return proc


def run_sessions(stack: _stack.Stack, n: int, *, agent_slug: str, token: str, database: str,
                 watch: int = 0) -> dict[str, Any]:
    """Start n sessions through the API from 32 clients; wait until each turn ends."""
    run = uuid.uuid4().hex[:8]
    work: queue.Queue[int] = queue.Queue()
    for i in range(n):
        work.put(i)
    created: list[str] = []
    errors: Counter[str] = Counter()
    watched_per_session = 4
    watchers = start_watchers(stack, watched_per_session, IDEAL * 6 + 60) if watch else None
    watched = 0
    log_after = stack.model_log()[-1]["seq"] if stack.model_stats()["answered"] else 0
    sampler = Sampler(stack, database if database.startswith("postgres") else None)
    processes = stack.product_processes()
    cpu_before = cpu_seconds(processes)
    cpu_by_pid_before = cpu_by_pid(stack.processes_by_name())

    async def clients() -> None:
        """32 concurrent API clients, as coroutines of one loop: the load generator shares the
        machine with the product, and 32 threads of a blocking client cost it about 2 ms of CPU a
        request (measured), most of a core at the creation rate."""
        import aiohttp

        nonlocal watched
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(stack.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout,
                                         connector=aiohttp.TCPConnector(limit=CLIENTS)) as http:
            async def client() -> None:
                nonlocal watched
                while True:
                    try:
                        i = work.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        async with http.post("/api/sessions", json={
                                "agent": agent_slug, "input": session_script(f"{run}-{i}"),
                                "metadata": {"bench": run}}) as response:
                            status, body = response.status, await response.read()
                    except (TimeoutError, aiohttp.ClientError) as exc:
                        errors[type(exc).__name__] += 1
                        continue
                    if status != 201:
                        errors[f"HTTP {status}"] += 1
                        continue
                    session_id = json.loads(body)["id"]
                    created.append(session_id)
                    if watchers is not None and watched < watch // watched_per_session:
                        watched += 1
                        assert watchers.stdin is not None
                        watchers.stdin.write(session_id + "\n")
                        watchers.stdin.flush()

            await asyncio.gather(*(client() for _ in range(CLIENTS)))

    sampler.start()
    started = time.time()
    asyncio.run(clients())
    created_in = time.time() - started
    deadline = started + max(IDEAL * 8, 120)
    finished: list[tuple[float, str]] = []
    while time.time() < deadline:
        stack.check()
        finished = finished_turns(database, run)
        if len(finished) >= len(created):
            break
        time.sleep(0.25)
    sampler.stopping.set()
    sampler.join()
    cpu = cpu_seconds(processes) - cpu_before
    cpu_split = cpu_split_since(stack, cpu_by_pid_before)
    times = sorted(f - started for f, _ in finished)
    wall = times[-1] if times else float("nan")
    statuses = Counter(status for _, status in finished)
    errors.update({f"turn {s}": c for s, c in statuses.items() if s != "completed"})
    errors["unfinished"] = len(created) - len(finished)
    entries = [e for e in stack.model_log(after=log_after) if f"bench {run}-" in e["last_user_message"]]
    per_call = Counter((e["last_user_message"].split("\n", 1)[0], e["position"]) for e in entries)
    duplicates = sum(c - 1 for c in per_call.values() if c > 1)
    # The engine's time between two model calls of a session: the previous answer was ready at the
    # model → the next request arrived there (the reply's transfer, recording, the inline tool).
    by_call = {(e["last_user_message"].split("\n", 1)[0], e["position"]): e for e in entries}
    gaps = [(by_call[(key, pos + 1)]["received_at"] - e["finished_at"]) * 1000
            for (key, pos), e in by_call.items() if (key, pos + 1) in by_call]
    first = sorted(e["received_at"] - started for (key, pos), e in by_call.items() if pos == 0)
    result: dict[str, Any] = {
        "layout": stack.layout, "n": n, "wall": wall, "ratio": wall / IDEAL, "p50": pct(times, 0.5),
        "p99": pct(times, 0.99), "created_in": created_in, "errors": +errors, "duplicates": duplicates,
        "model_calls": len(entries), "peak_connections": sampler.peak_connections,
        "peak_in_flight": sampler.peak_in_flight, "cpu_ms_per_step": cpu * 1000 / max(1, n * STEPS_PER_SESSION),
        "cpu_share": cpu / max(wall, 1e-9) / (os.cpu_count() or 1), "cpu_split": cpu_split,
        "gap_p50": pct(gaps, 0.5), "gap_p99": pct(gaps, 0.99), "first_call_p50": pct(first, 0.5),
        "first_call_p99": pct(first, 0.99)}
    if watchers is not None:
        assert watchers.stdin is not None and watchers.stdout is not None
        watchers.stdin.close()
        report = json.loads(watchers.stdout.readline())
        watchers.wait(timeout=30)
        result["push"] = _push.summary(report, created_by=started + created_in)
    return result


def finished_turns(database: str, run: str) -> list[tuple[float, str]]:
    """(finished_at as Unix time, status) of the run's finished turns, read straight from the database."""
    from datetime import UTC, datetime

    if database.startswith("sqlite:///"):
        import sqlite3

        with sqlite3.connect(database.removeprefix("sqlite:///"), timeout=30) as conn:
            rows = conn.execute(
                "SELECT t.finished_at, t.status FROM sessions_app_turn t JOIN sessions_app_agentsession s "
                "ON s.id = t.session_id WHERE json_extract(s.metadata, '$.bench') = ? AND t.finished_at IS NOT NULL",
                [run]).fetchall()
        return [(datetime.fromisoformat(f).replace(tzinfo=UTC).timestamp(), status) for f, status in rows]
    import psycopg

    with psycopg.connect(database.replace("postgres://", "postgresql://", 1)) as conn:
        rows = conn.execute(
            "SELECT t.finished_at, t.status FROM sessions_app_turn t JOIN sessions_app_agentsession s "
            "ON s.id = t.session_id WHERE s.metadata->>'bench' = %s AND t.finished_at IS NOT NULL", [run]).fetchall()
    return [(f.timestamp(), status) for f, status in rows]


async def _floor_session(clients: list[Any], i: int, workspace: Path) -> float:
    import openai
    from openai.types.chat import ChatCompletion

    from sessions_app.engine.llm import ModelReply, chunk_fold
    from tools_app.builtin import execute_tool

    client = clients[i % len(clients)]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a benchmark agent."},
                                      {"role": "user", "content": session_script(f"floor-{i}")}]
    tools = [{"type": "function", "function": {"name": "list_files", "parameters": {"type": "object"}}}]
    for _ in range(CALLS):
        # The gateway's way through the SDK (sessions_app.engine.llm._call_once): the body as JSON
        # and the chunks as JSON, without create()'s walk of the history and the chunks' objects,
        # which made this floor CPU-bound in its one process (28 % and 9 % of it, py-spy, N = 1,000).
        body = json.dumps({"model": "scripted", "messages": messages, "tools": tools, "stream": True}).encode()
        stream = await client.post("/chat/completions", content=body, cast_to=ChatCompletion, stream=True,
                                   stream_cls=openai.AsyncStream[object])
        reply, calls = ModelReply(), dict[int, dict[str, str]]()
        async for chunk in stream:
            chunk_fold(reply, calls, chunk)
        if not calls:
            break
        messages.append({"role": "assistant", "content": reply.content or None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()]})
        for c in calls.values():
            result = execute_tool(name=c["name"], workspace=workspace, arguments=json.loads(c["arguments"] or "{}"),
                                  timeout_seconds=10, network="none", idempotency_key=c["id"],
                                  should_cancel=lambda: False)
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": str(result.to_dict()["output"])})
    return time.time()


async def floor(model_url: str, n: int) -> dict[str, Any]:
    """One asyncio process: n sessions, AsyncOpenAI + aiohttp (8 clients), no database."""
    import openai

    clients = [openai.AsyncOpenAI(base_url=model_url, api_key="x", max_retries=0,
                                  http_client=openai.DefaultAioHttpClient()) for _ in range(8)]
    workspace = Path(tempfile.mkdtemp(prefix="agentops-bench-floor-"))
    started, cpu_before = time.time(), time.process_time()
    ends = await asyncio.gather(*[_floor_session(clients, i, workspace) for i in range(n)])
    cpu = time.process_time() - cpu_before
    for c in clients:
        await c.close()
    times = sorted(e - started for e in ends)
    # Its one process's CPU per model call (and the tool call after it): near one core's worth of
    # the wall time means this floor is bound by its process, not by the model's latency.
    return {"layout": "floor (asyncio)", "n": n, "wall": times[-1], "ratio": times[-1] / IDEAL,
            "p50": pct(times, 0.5), "p99": pct(times, 0.99), "cpu_ms_per_step": cpu * 1000 / (n * CALLS),
            "cpu_s": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", nargs="+", default=["multi", "make-run"], choices=["multi", "make-run"])
    parser.add_argument("--sessions", nargs="+", type=int, default=[100, 300, 1000])
    parser.add_argument("--make-run-sessions", nargs="+", type=int, default=[200])
    parser.add_argument("--watch-at", type=int, default=300, help="the N whose run has WebSocket watchers")
    parser.add_argument("--watchers", type=int, default=200)
    parser.add_argument("--web-processes", type=int, default=2, help="daphne processes of the multi layout")
    parser.add_argument("--live-processes", type=int, default=0,
                        help="daphne processes of their own for the WebSocket watchers (multi layout; 0: none)")
    args = parser.parse_args()

    config = _harness.configure(fresh_database=True)
    results: list[dict[str, Any]] = []
    print("many sessions at once (issue 10)")
    print(f"  session   {CALLS} model calls × {SLEEP_MS} ms (scripted sleep), list_files between; ideal {IDEAL:.0f} s")
    print(f"  clients   {CLIENTS} concurrent API clients create the sessions (POST /api/sessions)")
    print(f"  machine   {os.cpu_count()} CPUs; PostgreSQL {config['database']}; Redis {config['redis']}")
    # The floor first, on a quiet machine (the stacks' processes take a while to stop).
    if "multi" in args.layout:
        model = _stack.start_model(Path(tempfile.mkdtemp(prefix="agentops-bench-floor-")))
        try:
            for n in args.sessions:
                results.append(asyncio.run(floor(model.model_url, n)))
                print(f"  done floor N={n}: {results[-1]['ratio']:.2f}× ideal, its process {results[-1]['cpu_s']:.1f} "
                      f"CPU-s in {results[-1]['wall']:.1f} s", flush=True)
        finally:
            model.stop()
    for layout in args.layout:
        if layout == "multi":
            database, redis_url, counts = config["database"], config["redis"], args.sessions
        else:
            sqlite = Path(tempfile.mkdtemp(prefix="agentops-bench-sqlite-")) / "bench.sqlite3"
            database, redis_url, counts = f"sqlite:///{sqlite}", "", args.make_run_sessions
        stack = _stack.start(layout, database_url=database, redis_url=redis_url, workspaces=config["workspaces"],
                             web_processes=args.web_processes,
                             live_processes=args.live_processes if layout == "multi" else 0)
        try:
            token = _seed(stack, layout)
            print(f"  {layout:9} processes: {', '.join(stack.procs)} (logs {stack.logs})")
            for n in counts:
                watch = args.watchers if n == args.watch_at else 0
                result = run_sessions(stack, n, agent_slug="bench-concurrency", token=token, database=database,
                                      watch=watch)
                results.append(result)
                print(f"  done {layout} N={n}: {result['ratio']:.2f}× ideal, errors {dict(result['errors'])}",
                      flush=True)
        finally:
            stack.stop()
    print_table(results)


def _seed(stack: _stack.Stack, layout: str) -> str:
    """The agent, its owner (password for the watchers' login) and an API token, in the stack's database."""
    env = dict(stack.env, PASSWORD=PASSWORD, MODEL_URL=stack.model_url, PYTHONPATH=str(_stack.ROOT))
    out = subprocess.run([sys.executable, "-c", "from bench._seed import seed; print(seed())"], cwd=_stack.ROOT,
                         env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"seeding {layout} failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def print_table(results: list[dict[str, Any]]) -> None:
    print()
    print("layout          |     N |  wall s | × ideal |  p50 s |  p99 s | errors | dup | PG conns | in flight "
          "| CPU ms/step")
    floors = {r["n"]: r for r in results if r["layout"].startswith("floor")}
    for r in results:
        print(f"{r['layout']:15} | {r['n']:5} | {r['wall']:7.2f} | {r['ratio']:6.2f}× | {r['p50']:6.2f} | "
              f"{r['p99']:6.2f} | {sum(r.get('errors', {}).values()):6} | {r.get('duplicates', '-'):>3} | "
              f"{r.get('peak_connections', '-'):>8} | {r.get('peak_in_flight', '-'):>9} | "
              f"{r.get('cpu_ms_per_step', float('nan')):11.2f}")
    print()
    for r in results:
        if r["layout"] == "multi" and r["n"] in floors:
            print(f"multi N={r['n']}: {r['ratio']:.2f}× ideal = {r['wall'] / floors[r['n']]['wall']:.2f}× the asyncio "
                  f"floor ({floors[r['n']]['ratio']:.2f}× ideal)")
        if "cpu_split" in r:
            print(f"CPU s during {r['layout']} N={r['n']}: {r['cpu_split']}")
            print(f"  engine time between a session's model calls p50 {r['gap_p50']:.0f} ms, p99 {r['gap_p99']:.0f} ms;"
                  f" first call reached the model p50 {r['first_call_p50']:.2f} s, p99 {r['first_call_p99']:.2f} s "
                  f"after the start (all sessions created in {r['created_in']:.2f} s)")
        if "push" in r:
            p = r["push"]
            print(f"push during {r['layout']} N={r['n']}: {p['clients']} WebSocket clients, {p['deliveries']} live "
                  f"deliveries, created → received p50 {p['p50']:.0f} ms, p99 {p['p99']:.0f} ms, max {p['max']:.0f} ms;"
                  f" gaps replayed {p['gaps_replayed']}, reconnects {p['reconnects']}, lost after replay {p['lost']}"
                  + (f"; errors {p['errors']}" if p["errors"] else ""))
            count, p50, p99 = p["after_creation"]
            print(f"  of them after the last session was created (not the target's measure, which is all of "
                  f"them): {count}, p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    print()
    targets = [("multi", 1000, 1.5), ("make-run", 200, 1.5)]
    for layout, n, limit in targets:
        for r in results:
            if r["layout"] == layout and r["n"] == n:
                ok = r["ratio"] <= limit and not sum(r["errors"].values()) and r["duplicates"] == 0 and (
                    layout != "multi" or r["peak_connections"] <= 60)
                print(f"target {layout} N={n}: ≤ {limit}× ideal, 0 errors, 0 duplicates"
                      f"{', ≤ 60 connections' if layout == 'multi' else ''}: {'MET' if ok else 'MISSED'} "
                      f"({r['ratio']:.2f}×, errors {sum(r['errors'].values())}, dup {r['duplicates']}"
                      f"{', conns ' + str(r['peak_connections']) if layout == 'multi' else ''})")
        for r in results:
            if "push" in r and r["layout"] == layout:
                p = r["push"]
                print(f"target push p99 ≤ 100 ms, 0 lost ({layout} N={r['n']}): "
                      f"{'MET' if p['p99'] <= 100 and p['lost'] == 0 else 'MISSED'}")


if __name__ == "__main__":
    try:
        main()
    finally:
        _harness.cleanup_workspaces()
