"""The approvals services and selectors, called directly: the hash, consumption, grants, expiry."""

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agentops.domain import Conflict
from approvals_app import grants, services
from approvals_app.models import ApprovalGrant, ApprovalRequest
from sessions_app.models import Event, Step, Turn
from tests import factories
from tools_app.binding import run_spec, spec_sha256, tool_spec_sha256
from tools_app.models import ToolDefinition
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db


def _pending(**step_fields: Any) -> ApprovalRequest:
    tool_definitions_seed()
    turn = factories.turn(factories.session(owner=factories.user(groups=["operators"])))
    step_fields.setdefault("tool_name", "run_command")
    step_fields.setdefault("arguments", {"command": "make deploy"})
    step = factories.step(turn, call_id=f"call_{uuid.uuid4().hex[:8]}", approval_mode="mutating", **step_fields)
    return services.approval_request_create(step_id=step.id, sandbox_backend="bubblewrap", network_policy="none")


@pytest.fixture
def reviewer(db: None) -> User:
    return factories.user("rev", groups=["reviewers"])


def _approved(reviewer: User) -> ApprovalRequest:
    approval = _pending()
    return services.approval_decide(request_id=approval.request_id, actor=reviewer, decision="approve",
                                    seen_hash=approval.arguments_sha256)


# --- the hash binds what is approved ------------------------------------------------------------


def test_arguments_hash_covers_tool_arguments_backend_and_network() -> None:
    base: dict[str, Any] = {"tool_name": "run_command", "arguments": {"command": "ls"}, "sandbox_backend": "bubblewrap",
            "network_policy": "none"}
    reference = services.arguments_hash(**base)
    for change in ({"tool_name": "http_request"}, {"arguments": {"command": "ls -a"}},
                   {"sandbox_backend": "unsafe-subprocess"}, {"network_policy": "host"}):
        assert services.arguments_hash(**{**base, **change}) != reference, change
    # Key order does not matter: the hash is taken over canonical JSON.
    assert services.arguments_hash(**{**base, "arguments": {"b": 1, "a": 2}}) == services.arguments_hash(
        **{**base, "arguments": {"a": 2, "b": 1}})


def _run_hash(approval: ApprovalRequest) -> str:
    """The hash the executing task computes for the step's call as it would run now."""
    return services.approval_spec(tool_name=approval.tool_name, arguments=approval.effective_arguments,
                                  sandbox_backend=approval.sandbox_backend)[1]


def test_run_spec_binds_tool_version_arguments_network_limits_timeout_and_backend() -> None:
    tool_definitions_seed()
    tool = ToolDefinition.objects.get(name="run_command")
    base = run_spec(tool=tool, arguments={"command": "ls"}, sandbox_backend="bubblewrap")
    assert {"tool", "tool_version", "arguments", "network", "limits", "timeout_seconds", "sandbox_backend"} <= set(base)
    assert base["limits"]["memory_bytes"] > 0 and base["limits"]["timeout_seconds"] == tool.timeout_seconds
    reference = spec_sha256(base)
    assert spec_sha256(run_spec(tool=tool, arguments={"command": "ls -a"}, sandbox_backend="bubblewrap")) != reference
    assert spec_sha256(run_spec(tool=tool, arguments={"command": "ls"}, sandbox_backend="unsafe")) != reference
    for change in ({"network": "host"}, {"timeout_seconds": 5}, {"enabled": False},
                   {"parameters_schema": {"type": "object"}}):
        edited = ToolDefinition(**{**{f.attname: getattr(tool, f.attname) for f in tool._meta.concrete_fields},
                                   **change})
        assert spec_sha256(run_spec(tool=edited, arguments={"command": "ls"}, sandbox_backend="bubblewrap")) \
            != reference, change


def test_run_spec_limits_are_the_ones_the_command_applies_for_a_float_timeout() -> None:
    """A sandbox audit: timeout_seconds 5.0 (JSON Schema's integer takes it) showed the reviewer
    limits of 120 s while run_command applied 5 s."""
    from tools_app.builtin import execute_tool
    from tools_app.sandbox import workspace_for

    tool_definitions_seed()
    tool = ToolDefinition.objects.get(name="run_command")
    spec = run_spec(tool=tool, arguments={"command": "sleep 9", "timeout_seconds": 5.0}, sandbox_backend="bubblewrap")
    applied = execute_tool(name="run_command", workspace=workspace_for("float-timeout"),
                           timeout_seconds=tool.timeout_seconds,
                           arguments={"command": "true", "timeout_seconds": 5.0}).data["timeout_seconds"]
    assert spec["limits"]["timeout_seconds"] == applied == 5


def test_approval_consume_once_then_refused(reviewer: User) -> None:
    approval = _approved(reviewer)
    consumed = services.approval_consume(request_id=approval.request_id, run_sha256=_run_hash(approval))
    assert consumed.status == "consumed" and consumed.consumed_at is not None
    with pytest.raises(Conflict) as refused:
        services.approval_consume(request_id=approval.request_id, run_sha256=_run_hash(approval))
    assert refused.value.code == "not_approved"
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "consumed"


def test_approval_consume_refuses_arguments_altered_after_the_decision(reviewer: User) -> None:
    approval = _approved(reviewer)
    ApprovalRequest.objects.filter(pk=approval.pk).update(arguments={"command": "rm -rf /"})
    with pytest.raises(services.StaleArguments):
        services.approval_consume(request_id=approval.request_id, run_sha256=_run_hash(approval))
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "approved"


def test_approval_consume_refuses_a_policy_altered_after_the_decision(reviewer: User) -> None:
    approval = _approved(reviewer)
    ApprovalRequest.objects.filter(pk=approval.pk).update(network_policy="host")
    with pytest.raises(services.StaleArguments):
        services.approval_consume(request_id=approval.request_id, run_sha256=_run_hash(approval))


def test_approval_consume_refuses_a_run_that_is_not_what_was_approved(reviewer: User) -> None:
    approval = _approved(reviewer)
    with pytest.raises(services.RunSpecChanged):
        services.approval_consume(request_id=approval.request_id, run_sha256="0" * 64)
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "approved"


def test_an_edited_timeout_is_part_of_what_is_approved_and_runs(reviewer: User) -> None:
    approval = _pending(arguments={"command": "make deploy", "timeout_seconds": 30})
    edited = {"command": "make deploy", "timeout_seconds": 5}
    services.approval_decide(request_id=approval.request_id, actor=reviewer, decision="approve",
                             seen_hash=approval.arguments_sha256, arguments=edited)
    approval.refresh_from_db()
    assert approval.approved_sha256 != approval.arguments_sha256
    # The executing task's spec of the edited call (its limits follow the edited timeout) matches.
    assert services.approval_consume(request_id=approval.request_id, run_sha256=_run_hash(approval)).status == \
        "consumed"


def test_approval_consume_of_a_pending_request_is_refused() -> None:
    approval = _pending()
    with pytest.raises(Conflict):
        services.approval_consume(request_id=approval.request_id, run_sha256=_run_hash(approval))
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "pending"


# --- grants ------------------------------------------------------------------------------------------


def _grant(**fields: Any) -> ApprovalGrant:
    session = factories.session()
    turn = factories.turn(session)
    fields.setdefault("arguments_sha256", grants.args_sha256({"path": "a.txt", "content": "x"}))
    fields.setdefault("tool_spec_sha256", tool_spec_sha256(services.approval_spec(
        tool_name="write_file", arguments={"path": "a.txt", "content": "x"})[0]))
    return ApprovalGrant.objects.create(session=session, tool_name="write_file", turn=turn, **fields)


def _use(grant: ApprovalGrant, arguments: Any = None, *, tool_name: str = "write_file",
         turn_id: Any = None) -> ApprovalGrant | None:
    turn = Turn.objects.get(pk=str(turn_id or grant.turn_id))
    step = factories.step(turn, tool_name=tool_name, arguments=arguments or {"path": "a.txt", "content": "x"})
    return grants.grant_use(session_id=grant.session_id, turn_id=turn.id, step_id=step.id, tool_name=tool_name,
                              arguments=step.arguments,
                              spec=services.approval_spec(tool_name=tool_name, arguments=step.arguments)[0])


def test_grant_covers_its_tool_and_exact_arguments_only_and_each_use_is_an_event() -> None:
    grant = _grant()
    assert _use(grant) == grant
    assert _use(grant, {"path": "a.txt", "content": "something else"}) is None
    assert _use(grant, tool_name="run_command") is None
    grant.refresh_from_db()
    assert grant.uses == 1 and grant.last_used_at is not None
    (event,) = Event.objects.filter(session_id=grant.session_id, type="grant.used")
    assert event.payload["grant_id"] == grant.pk and event.payload["uses"] == 1


def test_grant_with_a_pattern_covers_matching_calls_that_name_no_other_argument() -> None:
    grant = _grant(arguments_sha256="", argument_pattern={"path": "notes/*.md", "content": "*"})
    assert _use(grant, {"path": "notes/a.md", "content": "hi"}) == grant
    assert _use(grant, {"path": "etc/passwd", "content": "hi"}) is None
    assert _use(grant, {"path": "notes/a.md", "content": "hi", "mode": "0777"}) is None


def test_grant_ends_with_its_turn_when_revoked_or_expired() -> None:
    grant = _grant()
    Turn.objects.filter(pk=str(grant.turn_id)).update(status="completed")
    next_turn = factories.turn(grant.session)
    assert _use(grant, turn_id=next_turn.id) is None
    revoked = _grant(revoked_at=timezone.now())
    assert _use(revoked) is None
    expired = _grant(expires_at=timezone.now() - timedelta(seconds=1))
    assert _use(expired) is None
    later = _grant(expires_at=timezone.now() + timedelta(hours=1))
    assert _use(later) == later


# --- expiry ------------------------------------------------------------------------------------------


def test_approval_decide_after_the_deadline_is_409_expired_and_the_expiry_is_kept(reviewer: User) -> None:
    approval = _pending()
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(Conflict) as refused:
        services.approval_decide(request_id=approval.request_id, actor=reviewer, decision="approve")
    assert refused.value.code == "expired"
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "expired"
    assert Step.objects.get(pk=approval.step_id).status == "expired"


def test_approval_expire_due_expires_only_what_is_due() -> None:
    due, later = _pending(), _pending()
    ApprovalRequest.objects.filter(pk=due.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert services.approval_expire_due() == 1
    assert ApprovalRequest.objects.get(pk=due.pk).status == "expired"
    assert ApprovalRequest.objects.get(pk=later.pk).status == "pending"
    assert services.approval_expire_due() == 0
