"""`make run`'s launcher: everything starts, one URL is printed, SIGTERM stops every child."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
from openai import OpenAI

from agentops import webserve
from agentops.embedded_redis import free_port
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_launcher_starts_web_worker_model_and_redis_then_stops_them_all(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "DATABASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "DATABASE_TEST_NAME")}
    env.update(PORT=str(port), DATABASE_URL=f"sqlite:///{tmp_path / 'run.sqlite3'}",
               AGENTOPS_WORKSPACE_ROOT="/tmp/agentops-launcher-test-ws", WORKER_CONCURRENCY="2")
    proc = subprocess.Popen([sys.executable, "-m", "agentops.run"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output: list[str] = []
    try:
        deadline = time.monotonic() + 180  # the launcher waits up to 120 s for /healthz
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            output.append(line)
            if "Ctrl-C stops everything" in line:
                break
        text = "".join(output)
        assert f"agentops is running at http://127.0.0.1:{port}/" in text, text[-3000:]
        assert "embedded Redis" in text and "LOCAL USE ONLY" in text
        children = psutil.Process(proc.pid).children(recursive=True)
        commands = {c.pid: " ".join(c.cmdline()) for c in children}  # read once: a pool child may come and go
        names = " ".join(commands.values())
        assert "daphne" in names and "celery" in names and "scripted_model" in names and "redis-server" in names
        assert "model_gateway" in names
        # Two Celery workers: the notifications on one of their own (a slow webhook receiver held the
        # engine's threads when they shared one).
        queues = sorted(c.split(" -Q ", 1)[1].split()[0] for c in commands.values() if "celery" in c and " -Q " in c)
        assert set(queues) == {"engine,sandbox,sandbox.local", "notify"}, queues
        # The worker and the gateway run at a lower CPU priority than daphne (agentops/priority.py).
        nice = {c.pid: c.nice() for c in children}
        for c in children:
            if "model_gateway" in commands[c.pid] or "celery" in commands[c.pid]:
                assert nice[c.pid] == 10, commands[c.pid]
            elif "daphne" in commands[c.pid]:
                assert nice[c.pid] == psutil.Process().nice(), commands[c.pid]
        # The URL is printed only once /healthz was green (the launcher warns when it gave up waiting).
        assert "/healthz is not 200" not in text, text[-3000:]
        assert httpx.get(f"http://127.0.0.1:{port}/api/agents", timeout=5).status_code == 401
        token = subprocess.run([sys.executable, "manage.py", "agentops_token", "admin"], cwd=ROOT, env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
        # And it stays green. Polled, because the worker (at nice 10) may miss one 0.7-s ping while
        # the suite's other processes hold both cores; the token shows which check failed if it stays red.
        last: list[str] = []

        def healthy() -> bool:
            response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5,
                                 headers={"Authorization": f"Bearer {token}"})
            last[:] = [response.text]
            return response.status_code == 200

        try:
            wait_for(healthy, 20, "/healthz to answer 200", interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it said {last}") from None
        # The OpenAI SDK at /openai/v1: an agent made there runs on make run's scripted model.
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/openai/v1", api_key=token)
        agent = client.beta.agents.create(model="scripted")
        stream = client.beta.agents.sessions.create(environment={"type": "none"}, agent_id=agent.id,
                                                    input="say hello from make run", stream=True)
        assert stream.get_final_result().output_text == "hello from make run"
        client.close()
        # Two daphne processes share the one listening socket: with either one stopped, the other
        # answers every request on the same port (so each serves).
        webs = [c for c in children if "daphne" in commands[c.pid]]
        assert len(webs) == webserve.DEFAULT_WEB_PROCESSES == 2
        for stopped in webs:
            stopped.suspend()
            try:
                statuses = {httpx.get(f"http://127.0.0.1:{port}/api/agents", timeout=10).status_code
                            for _ in range(10)}
            finally:
                stopped.resume()
            assert statuses == {401}
        # A child SIGKILLed is started again (it stopped the whole product before), and what it left
        # behind goes with it: the killed worker's Celery beat process (it ran on, orphaned).
        killed = {c.pid: commands[c.pid] for c in children if c.ppid() == proc.pid  # make run's own children
                  and ("model_gateway" in commands[c.pid] or "celery" in commands[c.pid])}
        worker_group = [c for c in children if "celery" in commands[c.pid]]
        assert len(worker_group) > len([pid for pid in killed if "celery" in killed[pid]])  # beat: not killed here
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: all(not c.is_running() or c.status() == psutil.STATUS_ZOMBIE for c in worker_group), 20,
                 "the killed worker's processes (its beat) to be gone")

        def replaced() -> bool:
            now = " ".join(" ".join(c.cmdline()) for c in psutil.Process(proc.pid).children(recursive=True)
                           if c.pid not in killed and c.is_running())
            return "model_gateway" in now and "celery" in now
        wait_for(replaced, 30, "a new gateway and worker")
        wait_for(healthy, 60, "/healthz to answer 200 after the restarts", interval=0.5)
        assert proc.poll() is None
        children = psutil.Process(proc.pid).children(recursive=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    def alive() -> list[psutil.Process]:
        return [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]

    # Every child stops with make run (polled: a child may take a moment to exit after SIGTERM).
    wait_for(lambda: not alive(), 10, "every child of make run to exit")
    assert proc.returncode == 0


def test_make_run_says_at_once_when_database_url_does_not_answer() -> None:
    """A wrong DATABASE_URL took a minute of the pool's retries and ended in "couldn't get a
    connection after 30.00 sec" (a README walk-through, 2026-12-04)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DATABASE_URL": "postgres://nobody@127.0.0.1:1/nodb", "PORT": "1"}
    done = subprocess.run([sys.executable, "-m", "agentops.run"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert "DATABASE_URL does not answer" in done.stderr and "Connection refused" in done.stderr, done.stderr
