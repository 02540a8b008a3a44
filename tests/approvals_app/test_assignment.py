"""Assignment: claims (exclusive while live, lapse after AGENTOPS_CLAIM_SECONDS, seen live by the
other reviewers), the queue's mine / unassigned / all filter and risk sort, presence over the
queue's WebSocket, and escalation before expiry with a controllable clock."""

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Group, User
from django.utils import timezone

from agentops.domain import Conflict
from approvals_app import selectors
from approvals_app.assignment import approval_claim, approval_claims_lapse, approval_escalate_due, approval_release
from approvals_app.models import ApprovalRequest
from approvals_app.presence import presence_token
from approvals_app.services import approval_expire_due
from sessions_app.models import Event
from tests import factories
from tests.approvals_app.review_helpers import approve, pending, policy, reviewers
from tests.helpers import login, ws_communicator


@pytest.mark.django_db
def test_a_claim_is_exclusive_while_live_and_lapses(settings) -> None:  # type: ignore[no-untyped-def]
    settings.AGENTOPS_CLAIM_SECONDS = 60
    alice, bob = reviewers(2)
    approval = pending()
    now = timezone.now()
    claimed = approval_claim(request_id=approval.request_id, actor=alice, now=now)
    assert claimed.claimed_by == alice and claimed.claim_live
    with pytest.raises(Conflict) as exc:
        approval_claim(request_id=approval.request_id, actor=bob, now=now + timedelta(seconds=30))
    assert exc.value.code == "claimed" and exc.value.details["claimed_by"] == alice.username
    assert approval_claims_lapse(now=now + timedelta(seconds=30)) == 0
    assert approval_claims_lapse(now=now + timedelta(seconds=61)) == 1
    released = Event.objects.get(step_id=approval.step_id, type="approval.released")
    assert released.payload["why"] == "timeout" and released.payload["previous_holder"] == alice.username
    assert approval_claim(request_id=approval.request_id, actor=bob).claimed_by == bob
    # a claim is advisory for decisions: another reviewer may still decide (a quorum needs them)
    assert approve(approval, alice).status == "approved"
    with pytest.raises(Conflict):
        approval_claim(request_id=approval.request_id, actor=alice)  # no longer pending


@pytest.mark.django_db
def test_release_and_the_queue_filters_and_risk_sort() -> None:
    alice, bob = reviewers(2)
    low = pending()
    ApprovalRequest.objects.filter(pk=low.pk).update(risk="low")
    mine, theirs = pending(), pending()
    approval_claim(request_id=mine.request_id, actor=alice)
    approval_claim(request_id=theirs.request_id, actor=bob)
    ids = lambda rows: [r.pk for r in rows]  # noqa: E731
    assert ids(selectors.approval_queue(user=alice, claim="mine")) == [mine.pk]
    assert ids(selectors.approval_queue(user=alice, claim="unassigned")) == [low.pk]
    assert ids(selectors.approval_queue(user=alice, order="risk")) == [mine.pk, theirs.pk, low.pk]
    ApprovalRequest.objects.filter(pk=low.pk).update(priority=1)
    assert ids(selectors.approval_queue(user=alice, order="risk"))[0] == low.pk  # escalated first
    approval_release(request_id=mine.request_id, actor=alice)
    assert ids(selectors.approval_queue(user=alice, claim="mine")) == []
    browser = login(alice)
    page = browser.get("/approvals/?claim=unassigned&order=risk")
    assert page.status_code == 200 and str(theirs.request_id).encode() not in page.content
    assert browser.post(f"/approvals/{theirs.request_id}/claim/", headers={"HX-Request": "true"}).status_code == 409
    assert browser.post(f"/approvals/{mine.request_id}/claim/", headers={"HX-Request": "true"}).status_code == 200


@pytest.mark.django_db
def test_escalation_before_expiry_with_a_controllable_clock() -> None:
    escalators = Group.objects.create(name="on-call leads")
    policy(team=factories.team(), tool_name="run_command", ttl_seconds=3600, escalate_before_seconds=600,
           escalation_group=escalators)
    approval = pending()
    start = approval.created_at
    assert approval.escalate_at is not None
    assert abs((approval.escalate_at - (start + timedelta(seconds=3000))).total_seconds()) < 5
    assert approval_escalate_due(now=start + timedelta(seconds=2900)) == 0
    assert approval_escalate_due(now=start + timedelta(seconds=3010)) == 1
    assert approval_escalate_due(now=start + timedelta(seconds=3020)) == 0  # once
    approval.refresh_from_db()
    assert (approval.priority, approval.status) == (1, "pending")
    assert Event.objects.filter(step_id=approval.step_id, type="approval.escalated").count() == 1
    # expiry stays expiry, never a rejection
    assert approval_expire_due(now=start + timedelta(seconds=3601)) == 1
    approval.refresh_from_db()
    assert (approval.status, approval.decision) == ("expired", "")
    late = pending()
    assert approval_escalate_due(now=late.created_at + timedelta(seconds=4000)) == 0  # due to expire instead


@database_sync_to_async
def _setup() -> tuple[User, User, ApprovalRequest, str]:
    alice, bob = reviewers(2)
    approval = pending()
    return alice, bob, approval, presence_token(approval)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_connections")
async def test_others_see_a_claim_and_presence_live() -> None:
    alice, bob, approval, token = await _setup()
    comm = await ws_communicator("/ws/approvals/", bob)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "hello", "since": timezone.now().isoformat()})
    try:
        await database_sync_to_async(approval_claim)(request_id=approval.request_id, actor=alice)
        message = await comm.receive_json_from(timeout=10)
        while message.get("event", {}).get("type") != "approval.claimed":
            message = await comm.receive_json_from(timeout=10)
        assert message["event"]["payload"]["claimed_by"] == alice.username
        assert 'data-claimed-by="' + alice.username + '"' in message["html"]
        assert f"review-{approval.request_id}" in message["html"]  # the decision page's card too
        await comm.send_json_to({"type": "viewing", "token": token})
        seen = await comm.receive_json_from(timeout=10)
        assert seen == {"type": "presence", "request_id": str(approval.request_id), "user": bob.username, "ttl": 30}
        await comm.send_json_to({"type": "viewing", "token": token[:-3] + "xyz"})
        refused = await comm.receive_json_from(timeout=10)
        assert refused["type"] == "error" and refused["code"] == "invalid_arguments"
    finally:
        await comm.disconnect()
