"""MCP tools through the real engine: a Celery worker, the model gateway, the scripted model, and
real MCP servers (stdio in the sandbox, streamable HTTP in its own process)."""

import json
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from approvals_app.models import ApprovalRequest
from mcp_app.models import McpServer
from mcp_app.services import mcp_server_refresh
from sessions_app.engine.commands import session_start
from sessions_app.engine.tool_steps import tool_step_run
from sessions_app.models import AgentProfile, AgentSession, Artifact, Event, Step, Turn
from tests import factories
from tests.helpers import assert_gap_free, finished, pending_approvals, script, tool
from tests.mcp_app.conftest import FixtureDirs
from tools_app.binding import tool_version
from tools_app.models import ApprovalMode, ToolDefinition
from tools_app.selectors import tool_definitions_cache_clear

pytestmark = pytest.mark.usefixtures("workers")


@pytest.fixture
def people(transactional_db: None) -> tuple[User, User]:
    return factories.user("oscar", groups=["operators"]), factories.user("rita", groups=["reviewers"])


def discovered(server: McpServer, agent: AgentProfile, **modes: str) -> None:
    """Discover the server's tools, give them to the agent, set the modes an admin chose."""
    assert mcp_server_refresh(server_id=server.id).error == ""
    for remote, mode in modes.items():
        ToolDefinition.objects.filter(name=f"{server.name}__{remote}").update(approval_mode=mode)
    agent.tools.add(*ToolDefinition.objects.filter(kind=ToolDefinition.Kind.MCP))
    tool_definitions_cache_clear()


def start(agent: AgentProfile, owner: User, text: str) -> tuple[AgentSession, Turn]:
    session, turn = session_start(agent=agent, owner=owner, input=text)
    assert turn is not None
    return session, turn


def decide(reviewer: User, approval: ApprovalRequest, **body: Any) -> Any:
    client = Client()
    client.force_login(reviewer)
    body.setdefault("arguments_sha256", approval.arguments_sha256)
    return client.post(f"/api/approvals/{approval.request_id}/decision", json.dumps(body),
                       content_type="application/json")


def the_step(turn: Turn, name: str) -> Step:
    return Step.objects.get(turn=turn, tool_name=name)


def test_mcp_stdio_results_and_failures_in_one_turn(
        engine_agent: AgentProfile, people: tuple[User, User], stdio_server: McpServer) -> None:
    """Read-only tools run without asking; structured and image results are recorded; a server
    that writes garbage or dies mid-call is a clear step error and the turn goes on."""
    discovered(stdio_server, engine_agent, lookup=ApprovalMode.SAFE_READONLY, snapshot=ApprovalMode.SAFE_READONLY,
               note=ApprovalMode.SAFE_READONLY)
    session, turn = start(engine_agent, people[0], script(
        tool("fx__lookup", key="abc"), tool("fx__snapshot"), tool("fx__note", text="__malformed__"),
        tool("fx__note", text="__crash__"), "say got: {results}"))
    turn = finished(turn, timeout=90)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert not ApprovalRequest.objects.filter(session=session).exists()
    lookup = the_step(turn, "fx__lookup")
    assert lookup.status == "completed" and lookup.result is not None and lookup.result["duration_ms"] > 0
    assert lookup.result["data"]["structured"] == {"key": "abc", "value": "ABC"}
    assert "ABC" in turn.output_text
    image = Artifact.objects.get(session=session)
    assert image.content_type == "image/png" and image.path.startswith("outputs/mcp/fx-snapshot-")
    assert (Path(settings.AGENTOPS_ARTIFACT_ROOT) / image.storage_path).read_bytes().startswith(b"\x89PNG")
    malformed, crashed = Step.objects.filter(turn=turn, tool_name="fx__note").order_by("index")
    # Not a timeout: the bad line ends the conversation at once.
    assert malformed.status == "failed" and malformed.error_code == "mcp_malformed_result", malformed.error_message
    assert "not json-rpc" in malformed.error_message
    assert crashed.status == "failed" and crashed.error_code == "mcp_connection_lost", crashed.error_message
    assert "unknown" in crashed.error_message and "mcp_connection_lost" in turn.output_text
    workspace = Path(AgentSession.objects.get(pk=session.pk).workspace)
    assert (workspace / "notes.log").read_text() == "__crash__\n"  # it did take effect before dying
    stdio_server.refresh_from_db()
    assert stdio_server.status == McpServer.Status.ERROR and "went away" in stdio_server.status_message
    assert_gap_free(session.id)


def test_mcp_mutating_tool_asks_a_reviewer_runs_exactly_once_and_a_slow_call_hits_the_deadline(
        engine_agent: AgentProfile, people: tuple[User, User], http_server: McpServer,
        fixture_dirs: FixtureDirs) -> None:
    McpServer.objects.filter(pk=http_server.pk).update(timeout_seconds=3)
    discovered(http_server, engine_agent, lookup=ApprovalMode.SAFE_READONLY)  # note stays mutating
    session, turn = start(engine_agent, people[0], script(tool("fxh__note", text="db restarted"),
                                                          tool("fxh__note", text="__slow__"), "say {results}"))
    (approval,) = pending_approvals(turn)
    definition = ToolDefinition.objects.get(name="fxh__note")
    # The hash binds the tool's version (server identity + tool + schema) and the arguments.
    assert approval.run_spec["tool_version"] == tool_version(definition)
    assert approval.run_spec["arguments"] == {"text": "db restarted"} and approval.network_policy == "host"
    assert decide(people[1], approval, decision="approve").status_code == 200
    (slow,) = pending_approvals(turn, timeout=60)
    assert decide(people[1], slow, decision="approve").status_code == 200
    turn = finished(turn, timeout=60)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert "noted: db restarted" in turn.output_text
    step, slow_step = Step.objects.filter(turn=turn, tool_name="fxh__note").order_by("index")
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "consumed"
    # A slow server: the deadline ends the call (server status: error), the turn goes on.
    assert slow_step.status == "failed" and slow_step.error_code == "timeout", slow_step.error_message
    assert "within 3 s" in slow_step.error_message
    http_server.refresh_from_db()
    assert http_server.status == McpServer.Status.ERROR
    # A redelivered task and a replayed decision change nothing: one effect.
    assert tool_step_run(step.id) is None
    assert decide(people[1], approval, decision="approve").status_code in (200, 409)
    assert (fixture_dirs.notes / "notes.log").read_text() == "db restarted\n"
    assert Step.objects.get(pk=step.pk).attempts == 1


def test_mcp_schema_change_invalidates_the_pending_approval(
        engine_agent: AgentProfile, people: tuple[User, User], stdio_server: McpServer,
        fixture_dirs: FixtureDirs) -> None:
    discovered(stdio_server, engine_agent)
    session, turn = start(engine_agent, people[0], script(tool("fx__note", text="first"), "say {results}"))
    (old,) = pending_approvals(turn)
    fixture_dirs.flag("schema_v2")  # the server now declares note(text, priority=1)
    report = mcp_server_refresh(server_id=stdio_server.id)
    assert report.changed == ["fx__note"] and report.invalidated == 1
    assert ApprovalRequest.objects.get(pk=old.pk).status == "cancelled"
    # The old request cannot be approved any more; a new one, bound to the new schema, is pending.
    assert decide(people[1], old, decision="approve").status_code == 409
    (new,) = pending_approvals(turn)
    assert new.pk != old.pk and new.arguments_sha256 != old.arguments_sha256
    assert decide(people[1], new, decision="approve").status_code == 200
    turn = finished(turn, timeout=60)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert "noted: 1:first" in turn.output_text
    assert list(session_events(session, "approval.invalidated")) == [str(old.request_id)]


def session_events(session: AgentSession, type_: str) -> list[str]:
    return [e.payload.get("request_id", "") for e in Event.objects.filter(session=session, type=type_)]




def test_mcp_call_in_flight_is_cancelled_with_the_session(
        engine_agent: AgentProfile, people: tuple[User, User], stdio_server: McpServer) -> None:
    """Cancelling the session while an MCP call runs: the server is told (notifications/cancelled),
    the worker lets go within seconds (the server would take 30 s, its deadline is 20 s), the step
    and the turn end cancelled, and the late result is dropped, not recorded."""
    discovered(stdio_server, engine_agent, note=ApprovalMode.SAFE_READONLY)
    session, turn = start(engine_agent, people[0], script(tool("fx__note", text="__slow__"), "say {results}"))
    deadline = time.monotonic() + 90
    while True:  # until the server is inside the call (the workspace is made by the first tool call)
        workspace = Path(AgentSession.objects.get(pk=session.pk).workspace or "/nonexistent")
        if (workspace / "started.log").exists():
            break
        assert time.monotonic() < deadline, "the MCP call never started"
        time.sleep(0.1)
    client = Client()
    client.force_login(people[0])
    cancelled_at = time.monotonic()
    assert client.post(f"/api/sessions/{session.id}/cancel").status_code == 200
    step = the_step(turn, "fx__note")
    while not Event.objects.filter(step=step, type="tool.result_dropped").exists():
        assert time.monotonic() - cancelled_at < 15, "the worker did not let go of the cancelled call"
        time.sleep(0.1)
    let_go = time.monotonic() - cancelled_at
    assert (workspace / "cancelled.log").read_text() == "__slow__\n"
    assert not (workspace / "notes.log").exists()
    turn.refresh_from_db()
    step.refresh_from_db()
    assert turn.status == "cancelled" and step.status == "cancelled"
    print(f"\nMCP call cancelled: worker let go {let_go:.2f} s after the cancel "
          f"(load {Path('/proc/loadavg').read_text().split()[:3]})")
    assert_gap_free(session.id)
