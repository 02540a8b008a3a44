"""`make run`: the whole product on one machine, one URL printed, every child stopped on exit.

Starts an embedded Redis when REDIS_URL is unset, the scripted model server unless
OPENAI_API_KEY / OPENAI_BASE_URL are set, migrates, seeds the demo, then runs daphne
($AGENTOPS_WEB_PROCESSES processes on one port, default 2), a Celery worker (ticks and commands,
with beat for the recovery sweeper; it is also the sandbox host "local", queue sandbox.local), a
second one for the notifications (queue notify, $NOTIFY_WORKER_CONCURRENCY threads, default 4),
the model gateway (the model calls, $AGENTOPS_GATEWAY_CONCURRENCY at once) and the announcer
(renders and sends the live events the others relay to it). The workers and the gateway run at a
lower CPU priority than daphne and the announcer (``agentops/priority.py``).
"""

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import ExitStack, suppress
from pathlib import Path

from agentops import priority, webserve
from agentops.embedded_redis import embedded_redis, free_port

ROOT = Path(__file__).resolve().parent.parent
RESTARTS_MAX = 3
RESTART_WINDOW_SECONDS = 60.0
PY = sys.executable


def wait_port(port: int, proc: subprocess.Popen[bytes], name: str, timeout: float = 30) -> None:
    """Return once ``proc`` listens on ``port``; RuntimeError if it exits or stays silent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} while starting")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.3).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{name} did not listen on port {port} within {timeout:.0f}s")


def _wait_healthy(port: int, timeout: float = 120) -> None:
    """Print the URL only once /healthz says the worker answers too (it boots after daphne)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    print(f"warning: /healthz is not 200 after {timeout:.0f}s; see http://127.0.0.1:{port}/healthz", file=sys.stderr)


def database_unreachable(url: str) -> str | None:
    """Why PostgreSQL at ``url`` does not answer (None: it does, or the URL is not PostgreSQL's).
    One connection with a 5-s timeout: a wrong DATABASE_URL otherwise took a minute of the pool's
    retries to fail, ending in "couldn't get a connection after 30.00 sec"."""
    if not url.startswith(("postgres://", "postgresql://")):
        return None
    import psycopg

    try:
        psycopg.connect(url.replace("postgres://", "postgresql://", 1), connect_timeout=5).close()
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def main() -> int:
    port = int(os.environ.get("PORT", "8000"))
    unreachable = database_unreachable(os.environ.get("DATABASE_URL", ""))
    if unreachable is not None:
        print(f"make run: DATABASE_URL does not answer: {unreachable}", file=sys.stderr)
        return 1
    host = os.environ.get("HOST", "127.0.0.1")
    env = dict(os.environ)
    # A local demo: the development secret key and the demo users are allowed (agentops/settings.py).
    env.setdefault("AGENTOPS_DEMO", "1")
    # Reviewer notifications (issue 17): emails land as files in var/mail; links point here.
    env.setdefault("EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend")
    env.setdefault("AGENTOPS_PUBLIC_URL", f"http://{host}:{port}")
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    with ExitStack() as stack:
        if not env.get("REDIS_URL"):
            env["REDIS_URL"] = stack.enter_context(embedded_redis())
            print(f"embedded Redis at {env['REDIS_URL']} (set REDIS_URL to use your own)")
        model_url = ""
        model: subprocess.Popen[bytes] | None = None
        mport = 0

        # How to start each child again (a supervisor's restart): its argv, environment, fds, priority.
        specs: dict[str, tuple[list[str], dict[str, str], tuple[int, ...], bool]] = {}

        def start(name: str) -> subprocess.Popen[bytes]:
            args, child_env, pass_fds, background = specs[name]
            proc = subprocess.Popen(args, cwd=ROOT, env=child_env, start_new_session=True, pass_fds=pass_fds)
            if background:
                priority.background(proc.pid)  # the web answers first when the cores are short
            return proc

        def spawn(name: str, args: list[str], pass_fds: tuple[int, ...] = (), child_env: dict[str, str] | None = None,
                  background: bool = False) -> subprocess.Popen[bytes]:
            specs[name] = (args, dict(child_env or env), pass_fds, background)
            proc = start(name)
            children.append((name, proc))
            return proc

        def stop_group(proc: subprocess.Popen[bytes], sig: int) -> None:
            """Signal the child's whole process group, alive or not: a SIGKILLed Celery worker left
            its beat process running, orphaned, writing tracebacks into the next run's log."""
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)

        def stop_all(*_: object) -> None:
            """The model server last: stopped with the rest, it failed every call the gateway was
            still draining (its turns ended model_unavailable). The gateway's drain takes up to 30 s."""
            first = [(n, p) for n, p in reversed(children) if n != "scripted model"]
            last = [(n, p) for n, p in children if n == "scripted model"]
            for group in (first, last):
                for _name, proc in group:
                    stop_group(proc, signal.SIGTERM)
                deadline = time.monotonic() + 35
                for _name, proc in group:
                    try:
                        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        stop_group(proc, signal.SIGKILL)

        stack.callback(stop_all)
        try:
            if not (env.get("OPENAI_API_KEY") or env.get("OPENAI_BASE_URL")):
                mport = free_port()
                # The demo's status API (on the scripted model server) and the token it wants, which
                # agentops_demo stores in the vault: the agent uses it by reference, never sees it.
                env.setdefault("AGENTOPS_DEMO_STATUS_TOKEN", secrets.token_urlsafe(24))
                env["AGENTOPS_DEMO_STATUS_URL"] = f"http://127.0.0.1:{mport}/demo/status"
                env.setdefault("AGENTOPS_HTTP_ALLOWED_HOSTS", "127.0.0.1")
                env.setdefault("AGENTOPS_HTTP_ALLOW_PRIVATE", "1")
                model = spawn("scripted model", [PY, "manage.py", "scripted_model", "--port", str(mport)])
                model_url = f"http://127.0.0.1:{mport}/v1"
                # The default endpoint of every process started from here on: agent profiles with
                # no endpoint of their own (those made through /openai/v1) use the scripted model.
                env["OPENAI_BASE_URL"] = model_url
            # The model boots while the database is migrated and seeded (one process for both).
            subprocess.run([PY, "manage.py", "agentops_demo", "--migrate", "--model-url", model_url], cwd=ROOT,
                           env=env, check=True)
            if model is not None:
                wait_port(mport, model, "scripted model")
            # The worker is also this machine's sandbox host "local" (queue sandbox.local): it registers
            # and heartbeats, sessions are pinned to it, and every process here shares its workspaces.
            local_host = env.get("AGENTOPS_SANDBOX_HOST") or "local"
            spawn("worker", [PY, "-m", "celery", "-A", "agentops", "worker", "-B", "-Q",
                             f"engine,sandbox,sandbox.{local_host}", "--pool", "threads", "--concurrency",
                             os.environ.get("WORKER_CONCURRENCY", "8"), "-l", "warning", "--schedule",
                             str(ROOT / "var" / "celerybeat-schedule")],
                  child_env={**env, "AGENTOPS_SANDBOX_HOST": local_host, "AGENTOPS_WORKSPACE_HOST": local_host},
                  background=True)
            # Notifications (webhooks, email) on a worker of their own: a receiver that answers slowly
            # takes its threads, never the engine's (a dripping one stalled every team's turns).
            spawn("notifier", [PY, "-m", "celery", "-A", "agentops", "worker", "-Q", "notify", "--pool", "threads",
                               "--concurrency", os.environ.get("NOTIFY_WORKER_CONCURRENCY", "4"), "-l", "warning",
                               "-n", "notify@%h"],
                  child_env={**env, "AGENTOPS_SANDBOX_HOST": "", "AGENTOPS_WORKSPACE_HOST": ""}, background=True)
            env["AGENTOPS_WORKSPACE_HOST"] = local_host
            spawn("gateway", [PY, "manage.py", "model_gateway"], background=True)
            for name, command in webserve.announcer_commands(PY, env).items():
                spawn(name, command)  # renders and sends the live events
            # $AGENTOPS_WEB_PROCESSES daphne processes (default 2) on one listening socket: one
            # process is bound to one core by the GIL (agentops/webserve.py).
            sock = stack.enter_context(webserve.listen(host, port))
            for n in range(webserve.web_processes()):
                spawn(f"web {n + 1}", webserve.daphne_command(PY, sock), pass_fds=(sock.fileno(),))
            _wait_healthy(port)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"make run failed: {exc}", file=sys.stderr)
            return 1
        print("\n" + "=" * 72)
        print(f"  agentops is running at http://{host}:{port}/")
        print("  demo users (LOCAL USE ONLY, change or delete them anywhere else):")
        print("    admin/admin   operator/operator   reviewer/reviewer")
        print("  Ctrl-C stops everything.")
        print("=" * 72 + "\n", flush=True)
        stopping = {"flag": False}

        def on_signal(signum: int, _frame: object) -> None:
            stopping["flag"] = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        # A child that dies is started again, as a supervisor would (the durable state is in the
        # database: a worker, gateway or web process killed mid-turn loses nothing); one that keeps
        # dying (RESTARTS_MAX within RESTART_WINDOW_SECONDS) stops everything with its name.
        deaths: dict[str, list[float]] = {}
        while not stopping["flag"]:
            for i, (name, proc) in enumerate(children):
                if proc.poll() is None or stopping["flag"]:
                    continue
                stop_group(proc, signal.SIGTERM)  # what it left behind (Celery's beat)
                now = time.monotonic()
                recent = [t for t in deaths.get(name, []) if now - t < RESTART_WINDOW_SECONDS] + [now]
                deaths[name] = recent
                if len(recent) >= RESTARTS_MAX:
                    print(f"{name} exited with {proc.returncode} {len(recent)} times in "
                          f"{RESTART_WINDOW_SECONDS:.0f} s; stopping", file=sys.stderr)
                    return 1
                print(f"{name} exited with {proc.returncode}; starting it again", file=sys.stderr, flush=True)
                children[i] = (name, start(name))
            time.sleep(0.3)
        print("stopping…")
    return 0


if __name__ == "__main__":
    sys.exit(main())
