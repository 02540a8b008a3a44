"""Approval policies: resolution (fallbacks, most specific wins, conditions), validation on save,
the engine's gate taking the policy's mode, and the decision page saying which policy applied."""

from typing import Any

import pytest

from agentops.domain import InvalidArguments
from approvals_app.conditions import conditions_errors, conditions_hold
from approvals_app.policies import approval_policy_resolve
from tests import factories
from tests.approvals_app.review_helpers import pending, policy
from tests.helpers import login
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db


def test_policy_resolution_table() -> None:
    team, other_team = factories.team(), factories.team("other")
    agent, other_agent = factories.agent_profile(), factories.agent_profile()
    anywhere = policy(name="global", risk="low")
    team_wide = policy(name="team", team=team, risk="medium")
    team_tool = policy(name="team+tool", team=team, tool_name="run_command", risk="high")
    agent_any_tool = policy(name="agent", team=team, agent=agent, risk="low", required_approvals=2)
    rm = policy(name="rm", team=team, tool_name="run_command",
                conditions=[{"path": "command", "op": "matches", "value": r"^rm\b"}], required_approvals=3)
    policy(name="disabled", team=team, tool_name="run_command", agent=other_agent, enabled=False)
    big = policy(name="big payment", tool_name="pay",
                 conditions=[{"path": "payment.amount", "op": "gt", "value": 1000}])
    host = policy(name="example host", tool_name="http_request",
                  conditions=[{"path": "url", "op": "host_in", "value": ["example.com"]}])
    table: list[tuple[Any, Any, str, Any, Any]] = [
        # (team, agent, tool, arguments, expected policy)
        (other_team, None, "write_file", {}, anywhere),                       # only the global one
        (team, None, "write_file", {}, team_wide),                            # team beats global
        (team, None, "run_command", {"command": "ls"}, team_tool),            # tool beats team
        (team, None, "run_command", {"command": "rm -rf x"}, rm),             # a held condition adds specificity
        (team, None, "run_command", {"command": "echo rm"}, team_tool),       # matches is anchored here
        (team, agent, "run_command", {"command": "rm -rf x"}, agent_any_tool),  # agent beats tool
        (team, other_agent, "run_command", {"command": "ls"}, team_tool),     # a disabled policy never applies
        (other_team, None, "pay", {"payment": {"amount": 1500}}, big),
        (other_team, None, "pay", {"payment": {"amount": 10}}, anywhere),     # condition fails: fall back
        (other_team, None, "pay", {"payment": {}}, anywhere),                 # a missing path is false
        (other_team, None, "http_request", {"url": "https://api.example.com/x"}, host),  # subdomain
        (other_team, None, "http_request", {"url": "https://example.com.evil.org/"}, anywhere),
    ]
    for team_obj, agent_obj, tool, arguments, expected in table:
        resolved = approval_policy_resolve(team_id=team_obj.pk, agent_id=agent_obj.pk if agent_obj else None,
                                           tool_name=tool, arguments=arguments)
        assert resolved is not None and resolved.policy_id == expected.pk, (tool, arguments, resolved)
    assert "conditions held: command matches" in (approval_policy_resolve(
        team_id=team.pk, agent_id=None, tool_name="run_command", arguments={"command": "rm x"}) or pytest).reason


def test_no_policy_resolves_to_none_and_the_tool_mode_applies() -> None:
    assert approval_policy_resolve(team_id=factories.team().pk, agent_id=None, tool_name="run_command",
                                   arguments={}) is None
    approval = pending()
    assert approval.policy_id is None and approval.required_approvals == 1
    assert approval.risk == "high" and approval.policy_reason == ""


@pytest.mark.parametrize(("conditions", "fragment"), [
    ({"path": "a"}, "JSON list"),
    ([{"path": "a", "op": "eq"}], "exactly path, op and value"),
    ([{"path": "a", "op": "eval", "value": 1}], "op must be one of"),
    ([{"path": "a b", "op": "eq", "value": 1}], "path must be"),
    ([{"path": "a", "op": "gt", "value": "10"}], "compares with a number"),
    ([{"path": "a", "op": "matches", "value": "("}], "invalid regular expression"),
    ([{"path": "a", "op": "matches", "value": "(?=x)x"}], "no lookarounds or backreferences"),
    ([{"path": "a", "op": "host_in", "value": "example.com"}], "list of host names"),
    ([{"path": "a", "op": "contains", "value": {"x": 1}}], "contains takes"),
])
def test_invalid_conditions_are_refused_on_save(conditions: Any, fragment: str) -> None:
    assert any(fragment in e for e in conditions_errors(conditions))
    with pytest.raises(InvalidArguments) as exc:
        policy(conditions=conditions)
    assert "conditions" in exc.value.details
    from approvals_app.models import ApprovalPolicy
    assert not ApprovalPolicy.objects.exists()  # nothing stored


def test_a_backtracking_pattern_runs_in_linear_time() -> None:
    """With Python's re, ^(a+)+$ against 30 a's and a '!' took 40 s in the tick (an admin audit,
    2026-12-04), and every session of that gateway stalled. RE2 answers at once; measured against
    the same search of a plain pattern, in the same run."""
    import time

    text = {"s": "a" * 5_000 + "!"}
    started = time.perf_counter()
    assert not conditions_hold([{"path": "s", "op": "matches", "value": "^(a+)+$"}], text)
    nested = time.perf_counter() - started
    started = time.perf_counter()
    assert not conditions_hold([{"path": "s", "op": "matches", "value": "^b"}], text)
    plain = time.perf_counter() - started
    assert nested < max(50 * plain, 0.05), (nested, plain)
    assert conditions_hold([{"path": "s", "op": "matches", "value": "^(a+)+!$"}], text)


@pytest.mark.parametrize(("fields", "field"), [
    ({"ttl_seconds": 2**40}, "ttl_seconds"), ({"ttl_seconds": 0}, "ttl_seconds"),
    ({"ttl_seconds": 60, "escalate_before_seconds": 3600}, "escalate_before_seconds"),
])
def test_a_time_to_live_outside_a_second_to_a_year_is_refused(fields: dict[str, Any], field: str) -> None:
    """2**40 s was stored (SQLite) and overflowed every expiry: each call needing review failed and
    its session stayed running with no error (an admin audit, 2026-12-04); 0 meant "never"."""
    with pytest.raises(InvalidArguments) as exc:
        policy(**fields)
    assert field in exc.value.details


def test_a_stored_time_to_live_past_a_year_expires_in_a_year() -> None:
    from datetime import timedelta

    from approvals_app.models import ApprovalPolicy

    made = policy(tool_name="run_command", ttl_seconds=60)
    ApprovalPolicy.objects.filter(pk=made.pk).update(ttl_seconds=2**31 - 1)  # 68 years, written around the admin
    approval = pending()
    assert approval.expires_at is not None
    assert approval.expires_at - approval.created_at < timedelta(days=366)


def test_quorum_outside_its_range_is_refused() -> None:
    with pytest.raises(InvalidArguments):
        policy(required_approvals=0)


def test_conditions_evaluate_every_operator() -> None:
    args = {"n": 5, "s": "deploy prod", "l": ["a", "b"], "u": "http://Sub.Example.com:8080/p", "nested": [{"k": 1}]}
    holds = [("n", "eq", 5), ("n", "ne", 4), ("n", "gte", 5), ("n", "lt", 6), ("n", "lte", 5),
             ("s", "matches", "prod$"), ("s", "contains", "ploy"), ("l", "contains", "b"),
             ("u", "host_in", ["example.com"]), ("nested.0.k", "eq", 1)]
    fails = [("n", "gt", 5), ("s", "gt", 1), ("s", "matches", "^prod"), ("l", "contains", "c"),
             ("u", "host_in", ["ample.com"]), ("nested.1.k", "eq", 1), ("missing", "ne", 1)]
    for path, op, value in holds:
        assert conditions_hold([{"path": path, "op": op, "value": value}], args), (path, op)
    for path, op, value in fails:
        assert not conditions_hold([{"path": path, "op": op, "value": value}], args), (path, op)


def test_the_policy_sets_risk_quorum_ttl_and_the_page_says_why() -> None:
    policy(name="Deploys need two", team=factories.team(), tool_name="run_command", risk="low", required_approvals=2,
           ttl_seconds=600, conditions=[{"path": "command", "op": "contains", "value": "deploy"}])
    approval = pending(arguments={"command": "make deploy"})
    assert (approval.required_approvals, approval.policy is not None, approval.risk) == (2, True, "low")
    assert approval.expires_at is not None
    assert 590 < (approval.expires_at - approval.created_at).total_seconds() <= 600
    page = login(factories.user(groups=["reviewers"])).get(f"/approvals/{approval.request_id}/")
    assert page.status_code == 200
    assert b"Deploys need two" in page.content and b"command contains" in page.content
    assert b"0 of 2 required" in page.content


def test_the_engine_gate_takes_the_policy_mode_and_quorum() -> None:
    from sessions_app.engine.tool_steps import tool_step_gate
    from sessions_app.models import Step
    from tools_app.models import ToolDefinition

    tool_definitions_seed()
    agent = factories.agent_profile()
    agent.tools.set(ToolDefinition.objects.filter(name__in=["write_file", "list_files"]))
    session = factories.session(agent=agent, owner=factories.user(groups=["operators"]))
    policy(name="notes are safe", team=session.team, tool_name="write_file", mode="safe_readonly",
           conditions=[{"path": "path", "op": "matches", "value": "^notes/"}])
    policy(name="listing asks two", agent=agent, tool_name="list_files", mode="mutating", required_approvals=2,
           risk="medium")
    turn = factories.turn(session)
    safe = factories.step(turn, tool_name="write_file", call_id="c1", arguments={"path": "notes/a.md", "content": "x"})
    asks = factories.step(turn, tool_name="write_file", call_id="c2", arguments={"path": "src/a.py", "content": "x"})
    listing = factories.step(turn, tool_name="list_files", call_id="c3", arguments={})
    assert tool_step_gate(step=safe, session=session) == Step.Status.APPROVED
    assert tool_step_gate(step=asks, session=session) == Step.Status.AWAITING_APPROVAL   # the tool's own mode
    assert tool_step_gate(step=listing, session=session) == Step.Status.AWAITING_APPROVAL  # safe tool, policy asks
    request = listing.approval_requests.get()
    assert (request.required_approvals, request.risk) == (2, "medium")
    assert "listing asks two" in request.risk_note
    assert asks.approval_requests.get().policy_id is None
