"""``python -m agentops.webserve``: a web host's daphnes on one port, as the README's layout runs them."""

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from django.conf import settings

from agentops.embedded_redis import free_port
from tests import factories
from tests.helpers import api_token, database_url, open_files_limited
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL, "LOG_LEVEL": "WARNING",
            "AGENTOPS_DB_POOL_SIZE": "4", "PYTHONUNBUFFERED": "1"}


def _start(*args: str, open_files: int | None = None) -> subprocess.Popen[str]:
    """The server; ``open_files``: the soft limit of open files it (and so its daphnes) starts with."""
    return subprocess.Popen([sys.executable, "-m", "agentops.webserve", *args], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=None if open_files is None else open_files_limited(open_files))


def _daphnes(parent: subprocess.Popen[str]) -> dict[int, psutil.Process]:
    found = {}
    for child in psutil.Process(parent.pid).children():
        try:
            if "daphne" in " ".join(child.cmdline()):
                found[child.pid] = child
        except psutil.NoSuchProcess:
            continue
    return found


def _listens_on(proc: psutil.Process, port: int) -> bool:
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in proc.net_connections("tcp"))
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def stopped() -> Iterator[list[subprocess.Popen[str]]]:
    """The servers a test starts; killed with their daphnes if the test did not stop them."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_two_daphnes_serve_one_port_a_dead_one_is_replaced_and_sigterm_stops_them_all(
        transactional_db: None, stopped: list[subprocess.Popen[str]]) -> None:
    token = api_token(factories.user("webserve-op", groups=["operators"]))
    port = free_port()
    server = _start("--port", str(port), "--processes", "2")
    stopped.append(server)
    assert server.stdout is not None
    first = server.stdout.readline()
    assert f"serving http://127.0.0.1:{port}/ with 2 daphne processes" in first, first

    daphnes = wait_for(lambda: len(d := _daphnes(server)) == 2 and all(_listens_on(p, port) for p in d.values())
                       and d, timeout=60, what="two daphnes listening on the one port")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as http:
        answer = wait_for(lambda: _get(http, "/api/agents"), timeout=60, what="an answer from the port")
        assert answer.status_code == 200 and answer.json() == []

        # One daphne dies: the port keeps answering, and the parent starts another in its place.
        victim = next(iter(daphnes))
        os.kill(victim, signal.SIGKILL)
        replaced = wait_for(lambda: len(d := _daphnes(server)) == 2 and victim not in d and d, timeout=30,
                            what="a daphne in place of the killed one")
        assert http.get("/api/agents").status_code == 200
        newcomer = next(p for pid, p in replaced.items() if pid not in daphnes)
        wait_for(lambda: _listens_on(newcomer, port), timeout=60, what="the new daphne on the same port")

    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=30) == 0
    for proc in replaced.values():
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    output = server.stdout.read()
    assert f"daphne {victim} exited with -9" in output and "starting another" in output, output[-2000:]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/api/agents", timeout=5)


def _get(http: httpx.Client, path: str) -> httpx.Response | None:
    try:
        return http.get(path)
    except httpx.TransportError:
        return None


def test_a_daphne_started_with_a_low_soft_limit_of_open_files_still_takes_hundreds_of_connections(
        transactional_db: None, stopped: list[subprocess.Popen[str]]) -> None:
    """Most shells and systemd start a process with a soft limit of 1,024 open files: a daphne
    holding that many WebSockets stopped accepting. Started here with 64, it raises its own."""
    token = api_token(factories.user("webserve-fd", groups=["operators"]))
    port = free_port()
    server = _start("--port", str(port), "--processes", "1", open_files=64)
    stopped.append(server)
    daphne = wait_for(lambda: next(iter(_daphnes(server).values()), None), timeout=30, what="the daphne")
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _get(httpx.Client(base_url=url, timeout=5), "/healthz"), timeout=60, what="an answer")
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(150)]
    try:
        wait_for(lambda: daphne.num_fds() > 150, timeout=30, what="the daphne holding the 150 connections")
        answer = httpx.get(url + "/api/agents", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert answer.status_code == 200
    finally:
        for conn in held:
            conn.close()


def test_daphnes_that_keep_failing_at_start_stop_the_server_with_their_reason(
        stopped: list[subprocess.Popen[str]]) -> None:
    server = _start("--port", str(free_port()), "--processes", "1", "--", "--no-such-daphne-option")
    stopped.append(server)
    output, _ = server.communicate(timeout=120)
    assert server.returncode == 1, output[-2000:]
    assert "--no-such-daphne-option" in output  # daphne's own complaint
    assert "daphne exited with 2 within 5 s of its start 3 times in a row; stopping" in output, output[-2000:]


def test_a_port_in_use_is_a_clear_error_and_nothing_starts(stopped: list[subprocess.Popen[str]]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = _start("--port", str(port))
        stopped.append(server)
        output, _ = server.communicate(timeout=60)
    assert server.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in output, output


@pytest.mark.parametrize(("args", "complaint"), [
    (["--processes", "0"], "argument --processes: must be at least 1, not 0"),
    (["--processes", "two"], "argument --processes: invalid positive_int value: 'two'"),
    (["--proxy-headers"], "unrecognized arguments: --proxy-headers"),
])
def test_bad_arguments_are_refused_before_anything_starts(args: list[str], complaint: str,
                                                          stopped: list[subprocess.Popen[str]]) -> None:
    server = _start(*args)
    stopped.append(server)
    output, _ = server.communicate(timeout=60)
    assert server.returncode == 2 and complaint in output, output
