"""Approval decision → ``tool.started`` latency, p50/p95 over 100 decisions, against a bare Celery hop.

Usage: .venv/bin/python bench/approval_latency.py [decisions]     (default 100)
Env:   DATABASE_URL (only its server is used: the benchmark works in its own database
       BENCH_DATABASE_NAME, default bench_agentops), REDIS_URL (default redis://127.0.0.1:6379/9).

Each session's scripted model asks for ``run_command {"command": "true"}`` (mutating: it needs a
reviewer) and then says "ok". When ``approval.requested`` arrives on the channel-layer group
``session.<id>``, a reviewer (group "reviewers", not the session's owner) calls
``approval_decide(decision="approve")``; the clock runs from that call until the ``tool.started``
event of the step arrives on the same group (events are announced after commit, so the row is
stored by then). The engine path is: decision transaction → after commit ``approval.decided``
announced and ``approval_decided`` sent → turn_advance_task (queue engine) → tool_run_task
(queue sandbox) → claim → ``tool.started`` committed and announced.
Floor: a bare Celery round trip measured the same way: enqueue a no-op task (queue engine) that
announces one message on the channel layer → it arrives on the group.
Target (issue 4): p95 ≤ 150 ms.
"""

import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    Listener,
    Worker,
    bench_agent,
    bench_member,
    cleanup_workspaces,
    configure,
    pct,
    start_model,
    summary,
)

DEFAULT_DECISIONS = 100
WARMUP = 3
QUIET_SECONDS = 0.05  # a reviewer decides later than the engine goes idle; let the worker settle first
SCRIPT = 'tool run_command {"command": "true"}\nsay ok'
WAIT_SECONDS = 30.0


def _setup(model_url: str) -> tuple[Any, Any, Any]:
    from django.contrib.auth.models import Group, User

    profile, owner = bench_agent("bench-approval-latency", model_url)
    reviewer, _ = User.objects.get_or_create(username="bench-reviewer")
    reviewer.groups.add(Group.objects.get(name="reviewers"))
    bench_member(reviewer, "reviewer")
    reviewer = User.objects.get(pk=reviewer.pk)  # drop the permission cache
    return profile, owner, reviewer


def _is(kind: str, **payload: Any) -> Any:
    def match(event: dict[str, Any]) -> bool:
        data = event.get("payload") or {}
        return event.get("type") == kind and all(data.get(k) == v for k, v in payload.items())

    return match


def celery_hop(listener: Listener, worker: Worker) -> float:
    """Enqueue the no-op → its announcement arrives: ms."""
    from _worker_tasks import ping

    group_id = f"bench-{uuid.uuid4()}"
    listener.subscribe(f"session.{group_id}")
    token = uuid.uuid4().hex
    started = time.perf_counter()
    ping.delay(group_id, token)
    arrived, _ = listener.wait_for(_is("bench.ping", token=token), WAIT_SECONDS, worker.check)
    listener.unsubscribe(f"session.{group_id}")
    return (arrived - started) * 1000


def approval(profile: Any, owner: Any, reviewer: Any, listener: Listener, worker: Worker) -> tuple[float, float]:
    """One decision: (ms until tool.started arrives, ms until approval_decide returned)."""
    from approvals_app.services import approval_decide
    from sessions_app.engine.commands import session_start, turn_submit

    session, _ = session_start(agent=profile, owner=owner, title="bench approval")
    group = f"session.{session.id}"
    listener.subscribe(group)
    turn = turn_submit(session_id=session.id, input=SCRIPT, actor=owner)
    _, requested = listener.wait_for(_is("approval.requested"), WAIT_SECONDS, worker.check)
    time.sleep(QUIET_SECONDS)
    started = time.perf_counter()
    approval_decide(request_id=requested["payload"]["request_id"], actor=reviewer, decision="approve")
    returned = time.perf_counter()
    arrived, event = listener.wait_for(_is("tool.started"), WAIT_SECONDS, worker.check)
    if event["step_id"] != requested["step_id"]:
        raise SystemExit(f"tool.started for another step: {event}")
    _, done = listener.wait_for(lambda e: e.get("type") in ("turn.completed", "turn.failed") and
                                e.get("turn_id") == str(turn.id), WAIT_SECONDS, worker.check)
    if done["type"] != "turn.completed" or (done["payload"] or {}).get("output_text") != "ok":
        raise SystemExit(f"the turn did not complete: {done}\n" + worker.tail())
    listener.unsubscribe(group)
    return (arrived - started) * 1000, (returned - started) * 1000


def main() -> None:
    decisions = int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DECISIONS
    config = configure()
    server, model_url = start_model()
    worker = Worker()
    listener: Listener | None = None
    ok = False
    try:
        worker.start()
        listener = Listener()
        _bench(decisions, config, model_url, worker, listener)
        ok = True
    finally:
        if listener is not None:
            listener.close()
        worker.stop(keep_log=not ok)
        server.shutdown()
        server.server_close()
        cleanup_workspaces()


def _bench(decisions: int, config: dict[str, str], model_url: str, worker: Worker, listener: Listener) -> None:
    import os

    import django

    from tools_app.sandbox import sandbox_status

    profile, owner, reviewer = _setup(model_url)
    status = sandbox_status(refresh=True)
    print("approval decision → tool.started latency (issue 4)")
    print(f"  database   {config['database']} (PostgreSQL)")
    print(f"  redis      {config['redis']}")
    print(f"  worker     {' '.join(worker.command[1:])}")
    print(f"  sandbox    {status.get('backend')} ok={status.get('ok')}")
    print(f"  model      scripted, zero latency, {model_url}; script: run_command `true` (needs approval), say ok")
    print(f"  measured   approval_decide() called → tool.started received on the channel layer group "
          f"session.<id>; {decisions} decisions, one session at a time, {QUIET_SECONDS * 1000:.0f} ms after "
          "approval.requested")
    print(f"  floor      enqueue a no-op Celery task (queue engine) → its channel-layer message received; "
          f"{decisions} round trips")
    print(f"  python {sys.version.split()[0]}, django {django.get_version()}, {os.cpu_count()} CPUs", flush=True)

    deadline = time.monotonic() + 60
    while True:  # the worker is up once a no-op makes the round trip
        try:
            celery_hop(listener, worker)
            break
        except TimeoutError:
            if time.monotonic() > deadline:
                raise SystemExit("the Celery worker did not answer in 60 s:\n" + worker.tail()) from None
    for _ in range(WARMUP):
        celery_hop(listener, worker)
        approval(profile, owner, reviewer, listener, worker)

    hops: list[float] = []
    latencies: list[float] = []
    decide_calls: list[float] = []
    for _ in range(decisions):  # interleaved, so drift and neighbours' load hit both alike
        time.sleep(QUIET_SECONDS)
        hops.append(celery_hop(listener, worker))
        latency, decide_call = approval(profile, owner, reviewer, listener, worker)
        latencies.append(latency)
        decide_calls.append(decide_call)

    p50, p95 = statistics.median(latencies), pct(latencies, 0.95)
    hop50, hop95 = statistics.median(hops), pct(hops, 0.95)
    print()
    print(f"decision → tool.started          {summary(latencies)}")
    print(f"  of which approval_decide() call {summary(decide_calls)}")
    print(f"bare Celery round trip (floor)   {summary(hops)}")
    print(f"ratio decision latency / floor   p50 {p50 / hop50:.2f}x  p95 {p95 / hop95:.2f}x "
          "(the engine path makes 2 Celery hops: engine tick, then the sandbox queue)")
    print(f"target p95 ≤ 150 ms: {'met' if p95 <= 150 else 'NOT met'} (p95 {p95:.1f} ms)")


if __name__ == "__main__":
    main()
