"""The long-running processes' tuning (agentops/runtime.py): the open files' soft limit."""

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from django.conf import settings

from tests.helpers import CHILD_OPEN_FILES_HARD, database_url, open_files_limited

ROOT = Path(__file__).resolve().parents[2]
HARD = CHILD_OPEN_FILES_HARD

OPEN_SOCKETS = """
import socket, sys
sys.path.insert(0, {root!r})
if {raise_first}:
    from agentops.runtime import open_files_raise
    print("soft limit", open_files_raise())
held = []
try:
    for _ in range(500):
        held.append(socket.socket())
except OSError as exc:
    print("failed after", len(held), exc.strerror)
else:
    print("opened", len(held))
"""


@pytest.mark.parametrize("raise_first", [False, True])
def test_a_process_started_with_a_low_soft_limit_raises_it_to_the_hard_one(raise_first: bool) -> None:
    out = subprocess.run([sys.executable, "-c", OPEN_SOCKETS.format(root=str(ROOT), raise_first=raise_first)],
                         capture_output=True, text=True, timeout=60, preexec_fn=open_files_limited(128)).stdout
    if raise_first:
        assert f"soft limit {HARD}" in out and "opened 500" in out, out
    else:  # what a gateway or daphne met before: the soft limit bites long before the hard one
        assert "failed after" in out and "Too many open files" in out, out


def _gateway_started(preexec_fn: Callable[[], None]) -> tuple[str, list[list[str]]]:
    """Start a model gateway (--concurrency 500) on the test database; its output until it reads the
    stream, and its "Max open files" limits (soft, hard) then."""
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL, "LOG_LEVEL": "WARNING",
           "AGENTOPS_DB_POOL_SIZE": "4", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "manage.py", "model_gateway", "--concurrency", "500", "--db-threads", "2"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=preexec_fn)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while not any("calls at once" in line for line in lines) and len(lines) < 20:
            lines.append(proc.stdout.readline())
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    return "".join(lines), [line.split()[3:5] for line in limits.splitlines() if line.startswith("Max open files")]


def test_a_gateway_whose_hard_limit_is_too_low_makes_fewer_calls_at_once_and_says_why(transactional_db: None) -> None:
    text, limits = _gateway_started(open_files_limited(300, 300))
    assert ("500 calls in flight need about 600 open files and this process may open 300; making 200 at once"
            in text), text
    assert "reading 200 calls at once" in text, text
    assert limits == [["300", "300"]]


def test_a_gateway_raises_its_soft_limit_and_keeps_its_concurrency(transactional_db: None) -> None:
    text, limits = _gateway_started(open_files_limited(256))
    assert "reading 500 calls at once" in text and "making" not in text, text
    assert limits == [[str(HARD), str(HARD)]]
