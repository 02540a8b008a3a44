"""The engine end to end in-process: a real Celery worker (threads), Redis, the database and
the scripted model over HTTP through the openai SDK."""

import hashlib
import json
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from approvals_app.models import ApprovalRequest
from sessions_app.engine import recovery
from sessions_app.engine.commands import session_cancel, session_start
from sessions_app.models import AgentProfile, AgentSession, Artifact, Event, Step, Turn
from tests import factories
from tests.helpers import assert_gap_free, finished, pending_approvals, sandboxed, script, tool
from tests.waiting import wait_for
from tools_app.models import Outbox, ToolDefinition
from tools_app.selectors import tool_definitions_cache_clear

pytestmark = pytest.mark.usefixtures("workers")


def start(agent: AgentProfile, owner: User, text: str, **kwargs: Any) -> tuple[AgentSession, Turn]:
    session, turn = session_start(agent=agent, owner=owner, input=text, **kwargs)
    assert turn is not None
    return session, turn


@pytest.fixture(autouse=True)
def _every_timeline_gap_free(transactional_db: None) -> Iterator[None]:
    yield
    for session in AgentSession.objects.all():
        assert_gap_free(session.id)


@pytest.fixture
def people(transactional_db: None) -> tuple[User, User]:
    return factories.user("oscar", groups=["operators"]), factories.user("rita", groups=["reviewers"])


def decide(reviewer: User, approval: ApprovalRequest, **body: Any) -> Any:
    client = Client()
    client.force_login(reviewer)
    body.setdefault("arguments_sha256", approval.arguments_sha256)
    return client.post(f"/api/approvals/{approval.request_id}/decision", json.dumps(body),
                       content_type="application/json")


def test_engine_read_only_turn_completes_without_approval(engine_agent: AgentProfile,
                                                          people: tuple[User, User]) -> None:
    engine_agent.starter_files = {"notes/a.txt": "alpha\n"}
    engine_agent.save()
    session, turn = start(engine_agent, people[0], script(tool("list_files", path="notes"),
                                                          tool("read_file", path="notes/a.txt"),
                                                          "say found: {results}"))
    turn = finished(turn)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert "read_file: alpha" in turn.output_text and "a.txt" in turn.output_text
    assert not ApprovalRequest.objects.filter(session=session).exists()
    types = list(Event.objects.filter(session=session).values_list("type", flat=True))
    assert types.count("tool.completed") == 2 and "model.delta" in types and types[-1] == "session.status_changed"
    assert AgentSession.objects.get(pk=session.pk).status == "idle"
    assert_gap_free(session.id)


def test_engine_mutating_tool_waits_for_approval_then_runs(engine_agent: AgentProfile,
                                                           people: tuple[User, User]) -> None:
    session, turn = start(engine_agent, people[0], script(tool("run_command", command="echo hi > out.txt; cat out.txt"),
                                                          "say ran: {results}"))
    (approval,) = pending_approvals(turn)
    assert Turn.objects.get(pk=turn.pk).status == "awaiting_approval"
    assert AgentSession.objects.get(pk=session.pk).status == "awaiting_approval"
    assert approval.arguments == {"command": "echo hi > out.txt; cat out.txt"}
    assert approval.sandbox_backend and approval.network_policy == "none"
    response = decide(people[1], approval, decision="approve")
    assert response.status_code == 200, response.content
    turn = finished(turn)
    assert turn.status == "completed"
    assert "run_command: hi" in turn.output_text
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "consumed"
    assert_gap_free(session.id)


def test_engine_rejection_reason_reaches_the_model(engine_agent: AgentProfile, people: tuple[User, User]) -> None:
    session, turn = start(engine_agent, people[0], script(tool("run_command", command="rm -rf /workspace/*"),
                                                          "say told: {results}"))
    (approval,) = pending_approvals(turn)
    assert decide(people[1], approval, decision="reject", reason="never delete the workspace").status_code == 200
    turn = finished(turn)
    assert turn.status == "completed"
    assert "never delete the workspace" in turn.output_text
    assert Step.objects.get(pk=approval.step_id).status == "rejected"


def test_engine_edited_arguments_run_and_the_model_is_told(engine_agent: AgentProfile,
                                                           people: tuple[User, User]) -> None:
    session, turn = start(engine_agent, people[0], script(tool("run_command", command="echo original"),
                                                          "say {results}"))
    (approval,) = pending_approvals(turn)
    assert decide(people[1], approval, decision="approve",
                  arguments={"command": "echo edited"}).status_code == 200
    turn = finished(turn)
    assert "reviewer changed the arguments" in turn.output_text
    step = Step.objects.get(pk=approval.step_id)
    assert step.arguments == {"command": "echo edited"} and "edited" in (step.result or {})["output"]
    stored = ApprovalRequest.objects.get(pk=approval.pk)
    assert stored.arguments == {"command": "echo original"} and stored.edited_arguments == {"command": "echo edited"}


def test_engine_edited_arguments_invalid_for_schema_is_422(engine_agent: AgentProfile,
                                                          people: tuple[User, User]) -> None:
    session, turn = start(engine_agent, people[0], script(tool("run_command", command="echo x"), "say {results}"))
    (approval,) = pending_approvals(turn)
    response = decide(people[1], approval, decision="approve", arguments={"command": 42})
    assert response.status_code == 422 and response.json()["code"] == "invalid_arguments"
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "pending"
    session_cancel(session_id=session.id)


def test_engine_expired_approval_is_reported_as_expired(engine_agent: AgentProfile,
                                                        people: tuple[User, User]) -> None:
    session, turn = start(engine_agent, people[0], script(tool("run_command", command="echo x"), "say {results}"))
    (approval,) = pending_approvals(turn)
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert recovery.sweep()["approvals_expired"] == 1
    turn = finished(turn)
    assert turn.status == "completed"
    assert "expired" in turn.output_text and "rejected" not in turn.output_text.replace("not rejected", "")
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "expired"
    late = decide(people[1], approval, decision="approve")
    assert late.status_code == 409 and late.json()["code"] == "expired"
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "expired"


def test_engine_parallel_calls_decided_out_of_order(engine_agent: AgentProfile, people: tuple[User, User]) -> None:
    session, turn = start(engine_agent, people[0], script(
        "parallel", tool("run_command", command="echo first"), tool("run_command", command="echo second"),
        tool("list_files", path="."), "end", "say {results}"))
    first, second = pending_approvals(turn, 2)
    assert decide(people[1], second, decision="approve").status_code == 200
    wait_for(lambda: Step.objects.get(pk=second.step_id).status == "completed", what="second to run")
    # The turn goes back to waiting for the first decision; nothing runs it meanwhile.
    wait_for(lambda: Turn.objects.get(pk=turn.pk).status == "awaiting_approval", what="turn to wait again")
    assert Step.objects.get(pk=first.step_id).status == "awaiting_approval"
    assert decide(people[1], first, decision="reject", reason="only the second").status_code == 200
    turn = finished(turn)
    assert turn.status == "completed"
    assert "second" in turn.output_text and "only the second" in turn.output_text
    assert_gap_free(session.id)


def test_engine_client_tool_waits_for_output(engine_agent: AgentProfile, people: tuple[User, User]) -> None:
    lookup = ToolDefinition.objects.create(name="lookup_customer", kind="client", approval_mode="safe_readonly",
                                           parameters_schema={"type": "object",
                                                              "properties": {"email": {"type": "string"}}})
    engine_agent.tools.add(lookup)
    tool_definitions_cache_clear()
    session, turn = start(engine_agent, people[0], script(tool("lookup_customer", email="a@example.com"),
                                                          "say {results}"))
    wait_for(lambda: Turn.objects.get(pk=turn.pk).status == "requires_action", what="requires_action")
    assert AgentSession.objects.get(pk=session.pk).status == "requires_action"
    step = Step.objects.get(turn=turn, tool_name="lookup_customer")
    client = Client()
    client.force_login(people[0])
    url = f"/api/sessions/{session.id}/tool-outputs"
    bad = client.post(url, json.dumps({"call_id": "nope", "output": "x"}), content_type="application/json")
    assert bad.status_code == 404
    ok = client.post(url, json.dumps({"call_id": step.call_id, "output": {"plan": "gold"}}),
                     content_type="application/json")
    assert ok.status_code == 200, ok.content
    turn = finished(turn)
    assert turn.status == "completed" and '"plan": "gold"' in turn.output_text


def test_engine_budget_exceeded_fails_the_turn(engine_agent: AgentProfile, people: tuple[User, User]) -> None:
    session, turn = start(engine_agent, people[0], script(tool("list_files", path="."), tool("list_files", path="."),
                                                          "say never"), budget={"max_tool_calls": 1})
    turn = finished(turn)
    assert turn.status == "failed" and turn.error_code == "budget_exceeded"
    event = Event.objects.get(session=session, type="budget.exceeded")
    assert event.payload["budget"] == "max_tool_calls" and event.payload["limit"] == 1
    assert AgentSession.objects.get(pk=session.pk).status == "failed"


def test_engine_cancel_mid_command_kills_it(engine_agent: AgentProfile, people: tuple[User, User]) -> None:
    marker = f"{time.time_ns() % 1000}.{os.getpid() % 1000}"  # a sleep of its own, ~60 s, findable by its argv
    session, turn = start(engine_agent, people[0], script(tool("run_command", command=f"sleep 6{marker}"),
                                                          "say never"))
    (approval,) = pending_approvals(turn)
    decide(people[1], approval, decision="approve")
    wait_for(lambda: sandboxed(f"sleep 6{marker}"), what="the command's process")
    session_cancel(session_id=session.id, actor=people[0])
    assert Turn.objects.get(pk=turn.pk).status == "cancelled"
    wait_for(lambda: Event.objects.filter(session=session, type="tool.cancelled").exists(), what="cancel event")
    # The sandbox sees the cancelled step and kills the command long before its minute is up.
    wait_for(lambda: not sandboxed(f"sleep 6{marker}"), timeout=15, what="the command to be killed")
    assert Step.objects.get(pk=approval.step_id).status == "cancelled"
    assert AgentSession.objects.get(pk=session.pk).status == "idle"


def test_engine_model_500_once_then_success(engine_agent: AgentProfile, people: tuple[User, User]) -> None:
    session, turn = start(engine_agent, people[0], script("error 500", "say recovered"))
    turn = finished(turn)
    assert turn.status == "completed" and turn.output_text == "recovered"
    assert Event.objects.filter(session=session, type="model.retrying").count() == 1


def test_engine_model_401_fails_at_once(engine_agent: AgentProfile, people: tuple[User, User],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from scripted_model.server import start_in_thread

    server, url = start_in_thread(port=0, api_key="right-key")
    try:
        monkeypatch.setenv("AGENTOPS_TEST_MODEL_KEY", "wrong-key")
        engine_agent.base_url, engine_agent.api_key_env = url, "AGENTOPS_TEST_MODEL_KEY"
        engine_agent.save()
        session, turn = start(engine_agent, people[0], "say hello")
        turn = finished(turn)
        assert turn.status == "failed" and turn.error_code == "authentication_error" and not turn.retryable
        assert not Event.objects.filter(session=session, type="model.retrying").exists()
    finally:
        server.shutdown()
        server.server_close()


def test_engine_api_key_env_outside_the_allow_list_sends_no_key(engine_agent: AgentProfile, people: tuple[User, User],
                                                                monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """An admin who names a server secret as an agent's key variable cannot send it to a model URL."""
    from scripted_model.server import start_in_thread

    server, url = start_in_thread(port=0, api_key="server-secret-value")
    try:
        monkeypatch.setenv("AGENTOPS_TEST_SERVER_SECRET", "server-secret-value")
        engine_agent.base_url, engine_agent.api_key_env = url, "AGENTOPS_TEST_SERVER_SECRET"
        engine_agent.save()
        _, refused = start(engine_agent, people[0], "say hello")
        refused = finished(refused)
        assert (refused.status, refused.error_code) == ("failed", "authentication_error")  # no key was sent
        settings.AGENTOPS_MODEL_KEY_ENVS = ["OPENAI_API_KEY", "AGENTOPS_TEST_SERVER_SECRET"]
        _, allowed = start(engine_agent, people[0], "say hello")
        assert finished(allowed).status == "completed"  # the same agent, once the variable is allowed
    finally:
        server.shutdown()
        server.server_close()


def test_engine_send_email_sends_once(engine_agent: AgentProfile, people: tuple[User, User]) -> None:
    session, turn = start(engine_agent, people[0], script(
        tool("send_email", to="ops@example.com", subject="Incident", body="resolved"), "say {results}"))
    (approval,) = pending_approvals(turn)
    decide(people[1], approval, decision="approve")
    turn = finished(turn)
    assert turn.status == "completed"
    assert Outbox.objects.filter(to="ops@example.com", status="sent").count() == 1


def test_engine_self_approval_is_forbidden(engine_agent: AgentProfile, people: tuple[User, User]) -> None:
    both = factories.user("both", groups=["operators", "reviewers"])
    session, turn = start(engine_agent, both, script(tool("run_command", command="echo x"), "say {results}"))
    (approval,) = pending_approvals(turn)
    response = decide(both, approval, decision="approve")
    assert response.status_code == 403 and response.json()["code"] == "self_approval_forbidden"
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "pending"
    session_cancel(session_id=session.id)


def test_engine_command_outputs_are_stored_as_artifacts_and_symlinks_out_are_not(
        engine_agent: AgentProfile, people: tuple[User, User]) -> None:
    command = "mkdir -p outputs && printf 'report\\n' > outputs/r.txt && ln -s /etc/passwd outputs/p.txt"
    session, turn = start(engine_agent, people[0], script(tool("run_command", command=command), "say {results}"))
    (approval,) = pending_approvals(turn)
    decide(people[1], approval, decision="approve")
    turn = finished(turn)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    (artifact,) = Artifact.objects.filter(session=session)
    assert artifact.path == "outputs/r.txt" and artifact.size == 7
    assert artifact.sha256 == hashlib.sha256(b"report\n").hexdigest()
    assert (Path(settings.AGENTOPS_ARTIFACT_ROOT) / artifact.storage_path).read_bytes() == b"report\n"
    assert Event.objects.filter(session=session, type="artifact.published").count() == 1


# --- what you approve is what runs ----------------------------------------------------------------

def test_engine_a_tool_edited_after_the_request_stops_the_step_and_asks_again(
        engine_agent: AgentProfile, people: tuple[User, User]) -> None:
    session, turn = start(engine_agent, people[0], script(tool("run_command", command="echo bound > out.txt"),
                                                          "say {results}"))
    (first,) = pending_approvals(turn)
    # The admin widens the tool while the request waits: the reviewer's approval must not cover it.
    ToolDefinition.objects.filter(name="run_command").update(network="host", timeout_seconds=7)
    tool_definitions_cache_clear()
    assert decide(people[1], first, decision="approve").status_code == 200
    second = wait_for(lambda: ApprovalRequest.objects.filter(turn=turn, status="pending").exclude(pk=first.pk).first(),
                      timeout=30)
    assert ApprovalRequest.objects.get(pk=first.pk).status == "cancelled"
    invalidated = Event.objects.get(session=session, type="approval.invalidated")
    assert {"network", "timeout_seconds", "tool_version", "limits"} <= set(invalidated.payload["changed"])
    assert second.network_policy == "host" and second.run_spec["timeout_seconds"] == 7
    assert not (Path(session.workspace or "/nonexistent") / "out.txt").exists()
    assert not Event.objects.filter(session=session, type="tool.started").exists()
    wait_for(lambda: Turn.objects.get(pk=turn.pk).status == "awaiting_approval" or None, timeout=30)
    decide(people[1], second, decision="approve")
    turn = finished(turn)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert (Step.objects.get(pk=first.step_id).result or {}).get("status") == "completed"


def test_engine_a_tool_disabled_after_the_request_never_runs(engine_agent: AgentProfile,
                                                             people: tuple[User, User]) -> None:
    session, turn = start(engine_agent, people[0], script(tool("run_command", command="echo x > out.txt"),
                                                          "say {results}"))
    (approval,) = pending_approvals(turn)
    ToolDefinition.objects.filter(name="run_command").update(enabled=False)
    tool_definitions_cache_clear()
    decide(people[1], approval, decision="approve")
    turn = finished(turn)
    step = Step.objects.get(pk=approval.step_id)
    assert step.status == "failed" and step.error_code == "tool_unavailable"
    assert Event.objects.filter(session=session, type="approval.invalidated").count() == 1
    assert not Event.objects.filter(session=session, type="tool.started").exists()
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "cancelled"
