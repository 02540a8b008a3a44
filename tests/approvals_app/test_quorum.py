"""Quorum: N distinct eligible approvals, any rejection rejects, every vote recorded; the hash
binding, four-eyes and exactly-once consumption hold; races resolve to exactly one outcome
(threads on PostgreSQL, each on its own connection)."""

from functools import partial
from typing import Any

import pytest
from django.contrib.auth.models import Group

from agentops.domain import Conflict, DomainError, InvalidArguments, PermissionDenied
from approvals_app import services
from approvals_app.models import ApprovalAudit, ApprovalRequest, ApprovalVote
from sessions_app.models import Event, Step
from tests import factories
from tests.approvals_app.review_helpers import approve, pending, policy, reviewers
from tests.concurrency import run_together


def _two_of_two(**fields: Any) -> ApprovalRequest:
    policy(team=factories.team(), tool_name="run_command", required_approvals=2, **fields)
    return pending()


@pytest.mark.django_db
def test_two_of_two_needs_two_distinct_reviewers_and_records_each_vote() -> None:
    first, second = reviewers(2)
    approval = _two_of_two()
    after_one = approve(approval, first)
    assert after_one.status == "pending"
    assert Step.objects.get(pk=approval.step_id).status == "awaiting_approval"
    assert approve(approval, first).status == "pending"  # a replay counts once
    assert ApprovalVote.objects.filter(request=approval).count() == 1
    assert Event.objects.filter(step_id=approval.step_id, type="approval.voted").count() == 1
    done = approve(approval, second)
    assert (done.status, done.decided_by) == ("approved", second)
    assert Step.objects.get(pk=approval.step_id).status == "approved"
    assert list(ApprovalVote.objects.filter(request=approval).values_list("reviewer", "decision")) == [
        (first.pk, "approve"), (second.pk, "approve")]
    assert ApprovalAudit.objects.filter(request_id=approval.request_id, action="voted").count() == 1
    # exactly-once consumption holds for the set: one consume, the second refused
    services.approval_consume(request_id=approval.request_id, run_sha256=approval.arguments_sha256)
    with pytest.raises(Conflict):
        services.approval_consume(request_id=approval.request_id, run_sha256=approval.arguments_sha256)


@pytest.mark.django_db
def test_any_rejection_rejects_and_a_voter_cannot_flip() -> None:
    first, second = reviewers(2)
    approval = _two_of_two()
    approve(approval, first)
    with pytest.raises(Conflict) as exc:
        approve(approval, first, decision="reject", reason="changed my mind")
    assert exc.value.code == "already_voted"
    rejected = approve(approval, second, decision="reject", reason="not today")
    assert rejected.status == "rejected"
    assert Step.objects.get(pk=approval.step_id).status == "rejected"


@pytest.mark.django_db
def test_quorum_keeps_hash_binding_four_eyes_and_the_reviewer_group() -> None:
    group = Group.objects.create(name="deployers")
    (outsider,) = reviewers(1)
    insider_a, insider_b = reviewers(2, group=group)
    approval = _two_of_two(reviewer_group=group)
    with pytest.raises(PermissionDenied) as exc:
        approve(approval, outsider)
    assert exc.value.code == "not_eligible"
    with pytest.raises(DomainError) as stale:
        services.approval_decide(request_id=approval.request_id, actor=insider_a, decision="approve",
                                 seen_hash="0" * 64)
    assert stale.value.code == "stale_arguments"
    with pytest.raises(InvalidArguments):  # a quorum approves what was asked, unedited
        approve(approval, insider_a, arguments={"command": "make other"})
    owner = approval.session.owner
    owner.groups.add(group, Group.objects.get(name="reviewers"))
    factories.member(owner, "default", "both")
    with pytest.raises(PermissionDenied):
        approve(approval, owner)  # four-eyes: not on their own session
    approve(approval, insider_a)
    assert approve(approval, insider_b).status == "approved"
    assert not ApprovalVote.objects.filter(reviewer__in=[outsider, owner]).exists()


@pytest.mark.django_db(transaction=True)
def test_the_nth_approval_racing_a_rejection_yields_exactly_one_outcome() -> None:
    for _ in range(3):  # a few rounds: either side may win, never both
        first, second, third = reviewers(3)
        approval = _two_of_two()
        approve(approval, first)
        outcomes = run_together([partial(approve, approval, second),
                                 partial(approve, approval, third, "reject", reason="no")])
        final = ApprovalRequest.objects.get(pk=approval.pk)
        assert final.status in ("approved", "rejected")
        winners = [o for o in outcomes if isinstance(o, ApprovalRequest)]
        losers = [o for o in outcomes if isinstance(o, DomainError)]
        assert len(winners) == 1 and len(losers) == 1 and losers[0].code == "already_decided"
        assert winners[0].status == final.status
        assert Event.objects.filter(step_id=approval.step_id, type="approval.decided").count() == 1
        assert Step.objects.get(pk=approval.step_id).status == final.status


@pytest.mark.django_db(transaction=True)
def test_concurrent_approvals_reach_the_quorum_once() -> None:
    people = reviewers(3)
    policy(team=factories.team(), tool_name="run_command", required_approvals=2)
    approval = pending()
    outcomes = run_together([partial(approve, approval, who) for who in people])
    final = ApprovalRequest.objects.get(pk=approval.pk)
    assert final.status == "approved"
    statuses = sorted(str(o.status) if isinstance(o, ApprovalRequest) else o.code for o in outcomes)
    # one vote short of the quorum, one that reached it, one that found it approved already (the same
    # decision: an idempotent answer, its vote not needed and not counted)
    assert statuses == ["approved", "approved", "pending"]
    assert ApprovalVote.objects.filter(request=approval).count() == 2
    assert Event.objects.filter(step_id=approval.step_id, type="approval.decided").count() == 1


@pytest.mark.django_db
def test_the_api_shows_the_policy_quorum_and_claim_and_votes_through_decisions() -> None:
    from approvals_app.assignment import approval_claim
    from tests.helpers import api_client

    first, second = reviewers(2)
    approval = _two_of_two(name="two for commands")
    approval_claim(request_id=approval.request_id, actor=first)
    client = api_client(first)
    body = client.get(f"/api/approvals/{approval.request_id}").json()
    assert (body["required_approvals"], body["claimed_by"], body["priority"]) == (2, first.username, 0)
    assert "two for commands" in body["policy"]
    decide = {"decision": "approve", "arguments_sha256": approval.arguments_sha256}
    voted = client.post(f"/api/approvals/{approval.request_id}/decision", decide, content_type="application/json")
    assert voted.status_code == 200 and voted.json()["status"] == "pending"
    done = api_client(second).post(f"/api/approvals/{approval.request_id}/decision", decide,
                                   content_type="application/json")
    assert done.status_code == 200 and done.json()["status"] == "approved" and done.json()["claimed_by"] is None
