"""Which approval policy applies to a call, and why.

Candidates: the enabled policies whose team, agent and tool are the call's or empty ("any") and
whose argument conditions all hold. The most specific wins: an agent beats a tool beats a team
beats conditions (a policy naming the agent is about that agent, whatever tool); then the lower
``position``, then the older. No policy: the tool definition's approval mode and the built-in risk
rules apply, as before policies existed.
"""

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Q

from agentops.domain import InvalidArguments
from approvals_app.conditions import conditions_errors, conditions_hold, describe
from approvals_app.models import ApprovalPolicy


@dataclass(frozen=True)
class ResolvedPolicy:
    policy_id: int
    name: str
    mode: str
    risk: str
    required_approvals: int
    reviewer_group_id: int | None
    ttl_seconds: int | None
    escalation_group_id: int | None
    escalate_before_seconds: int | None
    omit_arguments: bool
    reason: str


def _specificity(policy: ApprovalPolicy) -> tuple[int, int, int, int, int, int]:
    return (int(policy.agent_id is not None), int(bool(policy.tool_name)), int(policy.team_id is not None),
            len(policy.conditions or []), -policy.position, -policy.pk)


def _scope_text(policy: ApprovalPolicy) -> str:
    parts = [f"team {policy.team_id}" if policy.team_id else "any team",
             f"agent {policy.agent_id}" if policy.agent_id else "any agent",
             f"tool {policy.tool_name}" if policy.tool_name else "any tool"]
    return ", ".join(parts)


def approval_policy_resolve(*, team_id: int | None, agent_id: int | None, tool_name: str,
                            arguments: Any) -> ResolvedPolicy | None:
    """The policy for one call, with why it applied; None when none does. One query."""
    rows = (ApprovalPolicy.objects.filter(enabled=True)
            .filter(Q(team__isnull=True) | Q(team_id=team_id))
            .filter(Q(agent__isnull=True) | Q(agent_id=agent_id))
            .filter(Q(tool_name="") | Q(tool_name=tool_name)))
    # A stored policy with conditions the evaluator refuses (edited in the database by hand) never applies.
    candidates = [p for p in rows if not conditions_errors(p.conditions)
                  and conditions_hold(p.conditions or [], arguments)]
    if not candidates:
        return None
    candidates.sort(key=_specificity, reverse=True)
    best = candidates[0]
    why = f"Policy {best.name!r} ({_scope_text(best)})"
    if best.conditions:
        why += "; conditions held: " + "; ".join(describe(c) for c in best.conditions)
    if len(candidates) > 1:
        why += f"; the most specific of {len(candidates)} matching policies"
    why += f". Risk {best.risk}, {best.required_approvals} approval(s) required."
    return ResolvedPolicy(policy_id=best.pk, name=best.name, mode=best.mode, risk=best.risk,
                          required_approvals=best.required_approvals, reviewer_group_id=best.reviewer_group_id,
                          ttl_seconds=best.ttl_seconds, escalation_group_id=best.escalation_group_id,
                          escalate_before_seconds=best.escalate_before_seconds, omit_arguments=best.omit_arguments,
                          reason=why)


def approval_policy_create(**fields: Any) -> ApprovalPolicy:
    """Create a policy after validating it as the admin would (conditions, quorum range)."""
    policy = ApprovalPolicy(**fields)
    try:
        policy.full_clean()
    except ValidationError as exc:
        raise InvalidArguments("Invalid approval policy", details=exc.message_dict) from exc
    policy.save()
    return policy
