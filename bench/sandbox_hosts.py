"""Round trip of a ``true`` command: local sandbox vs a hosted sandbox host vs a customer runner.

Usage: .venv/bin/python -m agentops.embedded_redis -- .venv/bin/python bench/sandbox_hosts.py [samples]
Env:   DATABASE_URL (only its server: the benchmark uses its own database BENCH_DATABASE_NAME,
       default bench_hosts), REDIS_URL (set by agentops.embedded_redis).

Each sample is one approved ``run_command {"command": "true"}`` tool step of a fresh session:
- in process: ``execute_tool`` in this process (bubblewrap alone: no hand-over, no claim, no
  record; the floor of any path);
- local sandbox: an unpinned session on the one-machine queue ``sandbox`` (the local sandbox as it
  was before hosts existed, the issue's reference: what Celery, the claim and the record cost);
- hosted: the session is pinned to host ``bench-host`` (a ``manage.py sandbox_host`` worker
  process); the clock runs from the hand-over (``dispatch.tool_run_enqueue``, queue
  ``sandbox.bench-host``) until the step is completed in the database (claim, run, record);
- runner: the session is pinned to runner ``bench-runner`` (``python -m agentops.runner``, HTTP to
  a daphne on loopback); same clock: hand-over (a wake-up of its long-poll) → claim → signed job →
  verify → run → result POSTed → recorded.
The step's completion is observed by polling its row every 1 ms (adds ≤ 1 ms to both remote paths).
Prints p50/p95 of each, what the hosted and runner paths add over the local sandbox, and what
every path adds over the in-process floor, measured in the same run.
Target (issue 16): a runner adds ≤ 20 ms p50 on loopback over the local sandbox.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("BENCH_DATABASE_NAME", "bench_hosts")

from _harness import ROOT, bench_agent, cleanup_workspaces, configure, pct, summary  # noqa: E402
from _stack import free_port, wait_http  # noqa: E402

PY = sys.executable


def spawn(args: list[str], env: dict[str, str], logs: Path, name: str) -> subprocess.Popen[bytes]:
    log = (logs / f"{name}.log").open("ab")
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def main() -> None:
    samples = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    conf = configure()
    from django.utils import timezone

    from agentops import dispatch
    from hosts_app import runners
    from hosts_app.models import SandboxHost, SessionPlacement
    from sessions_app.models import Step
    from sessions_app.services import session_create, turn_create
    from tools_app.builtin import execute_tool
    from tools_app.models import ToolDefinition
    from tools_app.sandbox import workspace_for

    agent, owner = bench_agent("bench-hosts", "http://127.0.0.1:9/v1")
    ToolDefinition.objects.filter(name="run_command").update(approval_mode="safe_readonly")
    SessionPlacement.objects.filter(host__name__in=["bench-host", "bench-runner"]).delete()
    SandboxHost.objects.filter(name__in=["bench-host", "bench-runner"]).delete()
    runner, token = runners.runner_create(team=agent.team, name="bench-runner", actor=owner, pool="bench")
    owner.is_superuser = True
    owner.save()

    logs = Path(conf["workspaces"] + "-logs")
    logs.mkdir()
    env = {**os.environ, "AGENTOPS_HOST_HEARTBEAT_SECONDS": "1"}
    port = free_port()
    procs = [
        spawn([PY, "manage.py", "sandbox_host", "--name", "bench-host", "--pool", "bench", "--concurrency", "2"],
              {**env, "AGENTOPS_WORKSPACE_ROOT": conf["workspaces"] + "-host"}, logs, "host"),
        spawn([PY, "-m", "celery", "-A", "agentops", "worker", "-Q", "sandbox", "--pool", "threads", "-c", "2",
               "-l", "warning", "-n", "shared@%h"], env, logs, "shared"),
        spawn([PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "agentops.asgi:application"], env, logs, "web"),
    ]
    runner_env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE", "REDIS", "DJANGO"))}
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", ok=200, timeout=90, proc=procs[2])
    except SystemExit:
        wait_http(f"http://127.0.0.1:{port}/login/", timeout=30, proc=procs[2])
    procs.append(spawn([PY, "-m", "agentops.runner", "--url", f"http://127.0.0.1:{port}", "--token", token,
                        "--workdir", conf["workspaces"] + "-runner", "--wait", "20"], runner_env, logs, "runner"))
    try:
        deadline = time.monotonic() + 90
        while SandboxHost.objects.filter(name__in=["bench-host", "bench-runner"], status="online").count() < 2:
            if time.monotonic() > deadline:
                raise SystemExit(f"hosts did not come online; logs in {logs}")
            time.sleep(0.2)
        host = SandboxHost.objects.get(name="bench-host")

        def step_for(target: SandboxHost | None) -> Step:
            session = session_create(agent=agent, owner=owner)
            if target is not None:
                SessionPlacement.objects.create(session=session, host=target)
            turn = turn_create(session_id=session.id, input="bench")
            return Step.objects.create(session=session, turn=turn, index=0, kind="tool", tool_name="run_command",
                                       call_id="c", arguments={"command": "true"}, approval_mode="safe_readonly",
                                       status="approved")

        def remote(target: SandboxHost | None) -> list[float]:
            out = []
            for i in range(samples + 3):
                step = step_for(target)
                started = time.perf_counter()
                dispatch.tool_run_enqueue(step.id)
                while Step.objects.filter(pk=step.pk).values_list("status", flat=True)[0] not in ("completed",
                                                                                                   "failed"):
                    if time.perf_counter() - started > 60:
                        raise SystemExit(f"step {step.id} did not finish; logs in {logs}")
                    time.sleep(0.001)
                elapsed = (time.perf_counter() - started) * 1000
                assert Step.objects.get(pk=step.pk).status == "completed", Step.objects.get(pk=step.pk).result
                if i >= 3:  # warm-up
                    out.append(elapsed)
            return out

        inproc = []
        for i in range(samples + 3):
            session = session_create(agent=agent, owner=owner)
            workspace = workspace_for(session.id)
            started = time.perf_counter()
            result = execute_tool(name="run_command", workspace=workspace, arguments={"command": "true"})
            assert result.status == "completed", result
            if i >= 3:
                inproc.append((time.perf_counter() - started) * 1000)
        local = remote(None)
        hosted = remote(host)
        runner_ms = remote(runner)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        cleanup_workspaces()
    import statistics

    print(f"\nround trip of `true`, {samples} samples each, same run ({timezone.now():%Y-%m-%d %H:%M} UTC)")
    print(f"  in process (bwrap alone)         {summary(inproc)}")
    print(f"  local sandbox (queue sandbox)    {summary(local)}")
    print(f"  hosted host (sandbox.<host>)     {summary(hosted)}")
    print(f"  customer runner (HTTP)           {summary(runner_ms)}")

    def added(data: list[float], base: list[float], over: str) -> str:
        return (f"p50 {statistics.median(data) - statistics.median(base):+.2f} ms, p95 "
                f"{pct(data, 0.95) - pct(base, 0.95):+.2f} ms over {over} "
                f"(x{statistics.median(data) / statistics.median(base):.2f} p50)")

    for name, data in (("hosted", hosted), ("runner", runner_ms)):
        print(f"  {name} adds {added(data, local, 'the local sandbox')}")
    for name, data in (("local sandbox", local), ("hosted", hosted), ("runner", runner_ms)):
        print(f"  {name} adds {added(data, inproc, 'in process')}")
    over = statistics.median(runner_ms) - statistics.median(local)
    print(f"  target: a runner adds <= 20 ms p50 on loopback over the local sandbox: "
          f"{'met' if over <= 20 else 'NOT met'} ({over:+.2f} ms)")


if __name__ == "__main__":
    main()
