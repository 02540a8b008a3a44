"""Kept stdio server processes (``mcp_app.pool``) through the MCP runner, with real servers in the
real sandbox: one process per session, reused, restarted when it dies, stopped when idle; a slow
call hits its deadline and the server is told; a cancelled call ends within a bounded time; a
server whose files lie under a directory the sandbox uid cannot traverse still runs."""

import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from mcp_app import pool, stdio
from mcp_app.models import McpServer
from mcp_app.pool import call_pool
from mcp_app.runner import mcp_tool_run
from mcp_app.services import mcp_server_refresh
from sessions_app.models import AgentSession
from tests import factories
from tests.mcp_app.conftest import FIXTURE, FixtureDirs
from tools_app.builtin import ToolResult
from tools_app.runners import ToolRun


def _workspace(fixture_dirs: FixtureDirs) -> Path:
    """A session workspace the sandbox uid can write (under the traversable workspace root)."""
    path = fixture_dirs.flags.parent / f"ws-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    return path


def _call(server: McpServer, tool: str, workspace: Path, session: str,
          should_cancel: Callable[[], bool] | None = None, **arguments: Any) -> ToolResult:
    return mcp_tool_run(ToolRun(tool_name=f"{server.name}__{tool}", arguments=arguments, workspace=workspace,
                                timeout_seconds=server.timeout_seconds, network="none", team_id=server.team_id,
                                session_id=session, step_id="0123456789", idempotency_key="k",
                                should_cancel=should_cancel))


def _boot(result: ToolResult) -> str:
    assert result.status == "completed", (result.error_code, result.output)
    return str(result.data["structured"]["boot"])


def _wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


@pytest.mark.django_db
def test_mcp_stdio_server_is_kept_per_session_restarted_when_it_dies_and_faster(
        stdio_server: McpServer, fixture_dirs: FixtureDirs) -> None:
    assert mcp_server_refresh(server_id=stdio_server.id).error == ""
    ws_a, ws_b = _workspace(fixture_dirs), _workspace(fixture_dirs)
    started = time.monotonic()
    boot = _boot(_call(stdio_server, "whoami", ws_a, "sess-a"))
    first = time.monotonic() - started
    kept = []
    for _ in range(5):
        started = time.monotonic()
        assert _boot(_call(stdio_server, "whoami", ws_a, "sess-a")) == boot  # the same process
        kept.append(time.monotonic() - started)
    other = _call(stdio_server, "whoami", ws_b, "sess-b")
    assert _boot(other) != boot  # a process of its own
    # Its own workspace: what the server of session a writes, session b's does not see.
    assert _call(stdio_server, "note", ws_a, "sess-a", text="for a").status == "completed"
    assert (ws_a / "notes.log").read_text() == "for a\n" and not (ws_b / "notes.log").exists()
    # Dies during a call: a clear step error (effect unknown), and the next call gets a new process.
    crashed = _call(stdio_server, "note", ws_a, "sess-a", text="__crash__")
    assert crashed.status == "failed" and crashed.error_code == "mcp_connection_lost", crashed.output
    assert _boot(_call(stdio_server, "whoami", ws_a, "sess-a")) != boot
    with override_settings(AGENTOPS_MCP_STDIO_IDLE_SECONDS=0):  # the per-call mode, in the same run
        per_call = []
        boots = set()
        for _ in range(3):
            started = time.monotonic()
            boots.add(_boot(_call(stdio_server, "whoami", ws_a, "sess-a")))
            per_call.append(time.monotonic() - started)
        assert len(boots) == 3  # a new process each time
    ratio = statistics.median(per_call) / statistics.median(kept)
    print(f"\nMCP stdio whoami, load {Path('/proc/loadavg').read_text().split()[:3]}: first call of the session "
          f"{first * 1000:.0f} ms; kept process median {statistics.median(kept) * 1000:.1f} ms "
          f"(max {max(kept) * 1000:.1f}); process per call median {statistics.median(per_call) * 1000:.0f} ms; "
          f"ratio {ratio:.0f}x")
    assert ratio > 3, (kept, per_call)


@pytest.mark.django_db
def test_mcp_kept_stdio_server_stops_when_idle(stdio_server: McpServer, fixture_dirs: FixtureDirs) -> None:
    assert mcp_server_refresh(server_id=stdio_server.id).error == ""
    workspace = _workspace(fixture_dirs)
    with override_settings(AGENTOPS_MCP_STDIO_IDLE_SECONDS=1):
        boot = _boot(_call(stdio_server, "whoami", workspace, "sess-idle"))
        assert call_pool().live_count("sess-idle") == 1
        assert _wait_for(lambda: call_pool().live_count("sess-idle") == 0, timeout=15), "not stopped when idle"
        assert _boot(_call(stdio_server, "whoami", workspace, "sess-idle")) != boot


@pytest.mark.django_db
def test_mcp_slow_call_hits_the_deadline_and_the_server_is_told(stdio_server: McpServer,
                                                               fixture_dirs: FixtureDirs) -> None:
    """The deadline ends the call (``timeout``) and sends ``notifications/cancelled``: a server that
    honours it stays (it answers a ping); one that is stuck is replaced."""
    McpServer.objects.filter(pk=stdio_server.pk).update(timeout_seconds=8)
    stdio_server.refresh_from_db()
    assert mcp_server_refresh(server_id=stdio_server.id).error == ""
    workspace = _workspace(fixture_dirs)
    boot = _boot(_call(stdio_server, "whoami", workspace, "sess-slow"))
    started = time.monotonic()
    slow = _call(stdio_server, "note", workspace, "sess-slow", text="__slow__")
    assert slow.status == "failed" and slow.error_code == "timeout", (slow.error_code, slow.output)
    assert time.monotonic() - started < 8 + 4
    assert _wait_for(lambda: (workspace / "cancelled.log").exists(), timeout=5), "the server was not told"
    assert (workspace / "cancelled.log").read_text() == "__slow__\n"
    assert _boot(_call(stdio_server, "whoami", workspace, "sess-slow")) == boot  # kept: it answered a ping
    stuck = _call(stdio_server, "note", workspace, "sess-slow", text="__stuck__")
    assert stuck.error_code == "timeout"
    assert _boot(_call(stdio_server, "whoami", workspace, "sess-slow")) != boot  # replaced: it did not answer


@pytest.mark.django_db
def test_mcp_cancelled_step_ends_its_call_within_a_bounded_time(stdio_server: McpServer,
                                                                fixture_dirs: FixtureDirs) -> None:
    assert mcp_server_refresh(server_id=stdio_server.id).error == ""
    workspace = _workspace(fixture_dirs)
    _boot(_call(stdio_server, "whoami", workspace, "sess-cancel"))  # started: the call below is only the call

    def cancelled() -> bool:  # the step is cancelled once the server is inside the call
        return (workspace / "started.log").exists()

    started = time.monotonic()
    result = _call(stdio_server, "note", workspace, "sess-cancel", should_cancel=cancelled, text="__slow__")
    elapsed = time.monotonic() - started
    assert result.status == "failed" and result.error_code == "cancelled", (result.error_code, result.output)
    assert elapsed < 5, elapsed  # the server would take 30 s; its deadline is 20 s
    assert _wait_for(lambda: (workspace / "cancelled.log").exists(), timeout=5), "the server was not told"
    assert not (workspace / "notes.log").exists()  # the cancelled call had no effect


@pytest.mark.django_db
def test_mcp_stdio_server_under_a_0700_directory_runs(stdio_server: McpServer, tmp_path: Path,
                                                      fixture_dirs: FixtureDirs,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout under a directory only root can traverse (a 0700 home): the sandbox uid cannot
    reach it by path, yet the server it holds runs (its directory is staged for the sandbox)."""
    private = tmp_path / "home"
    checkout = private / "checkout" / "servers"
    checkout.mkdir(parents=True)
    shutil.copy(FIXTURE, checkout / "fixture_server.py")
    for path in (checkout, checkout.parent):
        path.chmod(0o755)
    (checkout / "fixture_server.py").chmod(0o644)
    private.chmod(0o700)
    assert os.geteuid() == 0, "the 0700 case needs a root worker dropping to the sandbox uid"
    McpServer.objects.filter(pk=stdio_server.pk).update(command=["python3", str(checkout / "fixture_server.py")],
                                                        mounts=[str(checkout), str(fixture_dirs.flags)])
    assert mcp_server_refresh(server_id=stdio_server.id).error == ""
    result = _call(stdio_server, "whoami", _workspace(fixture_dirs), "sess-700")
    assert result.status == "completed" and result.data["structured"]["uid"] != 0, result.output
    # Without the staging the sandbox cannot reach it: the test can fail.
    monkeypatch.setattr(stdio, "can_stage_binds", lambda: False)
    error = mcp_server_refresh(server_id=stdio_server.id).error
    assert error, "the server ran without its directory staged"


@pytest.mark.django_db(transaction=True)
def test_mcp_kept_stdio_server_stops_when_its_session_is_deleted(stdio_server: McpServer, fixture_dirs: FixtureDirs,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "SESSION_CHECK_SECONDS", 0.5)
    assert mcp_server_refresh(server_id=stdio_server.id).error == ""
    session_id = str(factories.turn().session_id)
    _boot(_call(stdio_server, "whoami", _workspace(fixture_dirs), session_id))
    time.sleep(6)  # at least one check of the sessions: it exists, so its server stays
    assert call_pool().live_count(session_id) == 1
    AgentSession.objects.filter(pk=session_id).delete()
    assert _wait_for(lambda: call_pool().live_count(session_id) == 0, timeout=15), "kept after its session went"
