"""Quorum: a request its policy says needs N approvals stays pending until N distinct eligible
reviewers approve; any rejection rejects. Every decision is a vote row (who, what, the hash they
saw), shown on the decision page.

Called by ``approval_decide`` under its locks (the session, then the request): the Nth approval
and a concurrent rejection queue on the same row lock, so exactly one of them decides and the
other finds the request decided (409). ``approvalvote_one_per_reviewer`` makes a reviewer count
once even if two of their clicks race.
"""

from typing import Literal

from django.contrib.auth.models import User

from agentops.domain import Conflict, InvalidArguments
from approvals_app.models import ApprovalAudit, ApprovalRequest, ApprovalVote
from sessions_app.events import event_record

Outcome = Literal["decide", "pending", "replay"]


def quorum_vote(approval: ApprovalRequest, *, actor: User, decision: str, reason: str, seen_hash: str | None,
                edited: bool) -> Outcome:
    """Record ``actor``'s vote on a pending tool request (locked by the caller).

    ``decide``: decide the request now (a rejection, or the approval that reaches the quorum);
    ``pending``: an approval short of the quorum, recorded with an ``approval.voted`` event;
    ``replay``: this reviewer already cast this vote (nothing changes).
    """
    quorum = approval.required_approvals > 1
    if quorum and decision == ApprovalVote.Decision.APPROVE and edited:
        raise InvalidArguments("A request that needs several approvals is approved as asked: editing the arguments "
                               "or remembering the approval needs a single-approval policy.",
                               code="quorum_no_edits", details={"field": "arguments"})
    # One vote decides a single-approval request, so a pending one holds no vote yet (a replay of
    # the deciding one finds the request decided before it gets here): only a quorum reads votes.
    prior = ApprovalVote.objects.filter(request=approval, reviewer=actor).first() if quorum else None
    if prior is not None:
        if prior.decision == decision:
            return "replay"
        raise Conflict(f"You already voted {prior.decision} on this request.", code="already_voted",
                       details={"vote": prior.decision})
    ApprovalVote.objects.create(request=approval, reviewer=actor, decision=decision, reason=reason,
                                seen_sha256=seen_hash or "")
    if not quorum or decision != ApprovalVote.Decision.APPROVE:
        return "decide"
    approvals = ApprovalVote.objects.filter(request=approval, decision=ApprovalVote.Decision.APPROVE).count()
    if approvals >= approval.required_approvals:
        return "decide"
    ApprovalAudit.objects.create(request_id=approval.request_id, session_id=approval.session_id,
                                 team_id=approval.team_id, action=ApprovalAudit.Action.VOTED, actor=actor,
                                 actor_username=actor.get_username(),
                                 details={"approvals": approvals, "required": approval.required_approvals,
                                          "seen_sha256": seen_hash or ""})
    event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                 type="approval.voted",
                 payload={"request_id": str(approval.request_id), "team_id": approval.team_id,
                          "tool": approval.tool_name, "status": approval.status, "voter": actor.get_username(),
                          "approvals": approvals, "required_approvals": approval.required_approvals})
    return "pending"
