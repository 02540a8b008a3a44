"""Real MCP servers for the tests: the fixture server (``fixture_server.py``) over stdio, run by
agentops inside the sandbox (a kept process per session), and over streamable HTTP as a process
the test starts."""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

from mcp_app.models import McpServer
from mcp_app.pool import call_pool
from tests import factories
from tools_app.sandbox import sandbox_status

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "fixture_server.py"


@dataclass
class FixtureDirs:
    flags: Path  # flag files switch the server's behaviour (see fixture_server.py)
    notes: Path  # the HTTP server's effects (a stdio server writes in the session's workspace)

    def flag(self, name: str, on: bool = True) -> None:
        path = self.flags / name
        if on:
            path.touch()
        else:
            path.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _stop_kept_servers() -> Iterator[None]:
    """A kept server process outlives its call by design: none outlives its test."""
    yield
    call_pool().stop_all()


@pytest.fixture
def real_sandbox() -> None:
    status = sandbox_status()
    assert status["ok"] and not status["unsafe"], f"bubblewrap is not usable here: {status}"


@pytest.fixture
def fixture_dirs() -> FixtureDirs:
    # Under the workspace root (traversable by the sandbox uid), readable by it: mounted read-only.
    base = Path(settings.AGENTOPS_WORKSPACE_ROOT) / "mcp-fixture"
    flags, notes = base / "flags", base / "notes"
    for path in (base, flags, notes):
        path.mkdir(exist_ok=True)
        path.chmod(0o755)
    return FixtureDirs(flags=flags, notes=notes)


@pytest.fixture
def stdio_server(db: None, fixture_dirs: FixtureDirs, real_sandbox: None) -> McpServer:
    return McpServer.objects.create(
        team=factories.team(), name="fx", transport=McpServer.Transport.STDIO,
        command=["python3", str(FIXTURE)], mounts=[str(HERE), str(fixture_dirs.flags)],
        env={"MCP_FIXTURE_FLAGS": str(fixture_dirs.flags)}, timeout_seconds=20)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def http_server_process(fixture_dirs: FixtureDirs) -> Iterator[str]:
    """The fixture server over streamable HTTP in its own process; yields its URL."""
    port = _free_port()
    env = {**os.environ, "MCP_FIXTURE_PORT": str(port), "MCP_FIXTURE_FLAGS": str(fixture_dirs.flags),
           "MCP_FIXTURE_NOTES": str(fixture_dirs.notes)}
    proc = subprocess.Popen([sys.executable, str(FIXTURE), "--http"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            assert proc.poll() is None, "the MCP fixture server died on start-up"
            time.sleep(0.1)
    else:
        raise AssertionError("the MCP fixture server did not listen within 30 s")
    yield f"http://127.0.0.1:{port}/mcp"
    proc.kill()
    proc.wait()


@pytest.fixture
def http_server(db: None, http_server_process: str) -> McpServer:
    return McpServer.objects.create(team=factories.team(), name="fxh", transport=McpServer.Transport.HTTP,
                                    url=http_server_process, timeout_seconds=5)
