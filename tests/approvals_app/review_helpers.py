"""Requests under approval policies, for the reviewer-workflow tests (issue 17)."""

import uuid
from typing import Any

from django.contrib.auth.models import Group, User

from approvals_app import services
from approvals_app.models import ApprovalPolicy, ApprovalRequest
from approvals_app.policies import approval_policy_create, approval_policy_resolve
from sessions_app.models import AgentProfile, AgentSession
from tests import factories
from tools_app.services import tool_definitions_seed


def policy(**fields: Any) -> ApprovalPolicy:
    fields.setdefault("name", f"policy {uuid.uuid4().hex[:6]}")
    return approval_policy_create(**fields)


def reviewers(n: int, *, group: Group | None = None, email: bool = True) -> list[User]:
    people = []
    for _ in range(n):
        u = factories.user(groups=["reviewers"], email=f"r{uuid.uuid4().hex[:6]}@example.org" if email else "")
        if group is not None:
            u.groups.add(group)
        people.append(u)
    return people


def pending(*, tool: str = "run_command", arguments: dict[str, Any] | None = None,
            session: AgentSession | None = None, agent: AgentProfile | None = None) -> ApprovalRequest:
    """A pending request made as the engine's gate makes it: the policy resolved for the session's
    team, agent, tool and arguments, applied to the request."""
    tool_definitions_seed()
    session = session or factories.session(agent=agent, owner=factories.user(groups=["operators"]))
    turn = factories.turn(session)
    args = arguments if arguments is not None else {"command": "make deploy"}
    step = factories.step(turn, tool_name=tool, call_id=f"call_{uuid.uuid4().hex[:8]}", arguments=args,
                          approval_mode="mutating")
    resolved = approval_policy_resolve(team_id=session.team_id, agent_id=session.agent_id, tool_name=tool,
                                       arguments=args)
    return services.approval_request_create(step_id=step.id, sandbox_backend="bubblewrap", network_policy="none",
                                            policy=resolved, risk=resolved.risk if resolved else "high",
                                            risk_note=resolved.reason if resolved else "",
                                            ttl_seconds=resolved.ttl_seconds if resolved else None)


def approve(approval: ApprovalRequest, who: User, decision: str = "approve", **kw: Any) -> ApprovalRequest:
    return services.approval_decide(request_id=approval.request_id, actor=who, decision=decision,
                                    seen_hash=approval.arguments_sha256, **kw)
