"""Bulk approval of identical requests across sessions: each is decided, recorded and consumed on
its own; a batch that is not identical decides nothing."""

import pytest

from agentops.domain import Conflict, InvalidArguments
from approvals_app import services
from approvals_app.bulk import approval_bulk_approve
from approvals_app.models import ApprovalAudit, ApprovalRequest
from sessions_app.models import Event
from tests.approvals_app.review_helpers import pending, reviewers
from tests.helpers import login

pytestmark = pytest.mark.django_db


def test_bulk_approval_of_20_identical_requests_from_one_page(django_assert_max_num_queries) -> None:  # type: ignore[no-untyped-def]
    (alice,) = reviewers(1)
    batch = [pending(arguments={"command": "make test"}) for _ in range(20)]
    other = pending(arguments={"command": "make other"})
    assert len({a.arguments_sha256 for a in batch}) == 1 and len({a.session_id for a in batch}) == 20
    browser = login(alice)
    with django_assert_max_num_queries(20):  # the groups, not one query per request
        page = browser.get("/approvals/bulk/")
    assert page.status_code == 200 and b"Approve all 20" in page.content
    assert str(other.request_id).encode() not in page.content
    form = {"request_id": [str(a.request_id) for a in batch], "arguments_sha256": batch[0].arguments_sha256}
    response = browser.post("/approvals/bulk/", form)
    assert response.status_code == 302 and response["Location"] == "/approvals/bulk/"
    shown = browser.get(response["Location"]).content.decode()
    assert "Approved 20 of 20" in shown
    assert all(f"{a.session}</a>: approved" in shown for a in batch)  # each outcome names its session
    reloaded = browser.get("/approvals/bulk/").content.decode()  # a reload posts nothing again
    assert "Approved" not in reloaded and 'id="bulk-outcomes"' not in reloaded
    assert ApprovalRequest.objects.filter(pk__in=[a.pk for a in batch], status="approved",
                                          decided_by=alice).count() == 20
    assert ApprovalAudit.objects.filter(action="decided", actor=alice).count() == 20
    assert Event.objects.filter(type="approval.decided").count() == 20
    for a in batch:  # consumed individually, once each
        services.approval_consume(request_id=a.request_id, run_sha256=a.arguments_sha256)
        with pytest.raises(Conflict):
            services.approval_consume(request_id=a.request_id, run_sha256=a.arguments_sha256)
    assert ApprovalRequest.objects.get(pk=other.pk).status == "pending"


def test_a_mixed_or_stale_batch_decides_nothing() -> None:
    (alice,) = reviewers(1)
    a, b = pending(arguments={"command": "make a"}), pending(arguments={"command": "make b"})
    with pytest.raises(InvalidArguments) as exc:
        approval_bulk_approve(request_ids=[a.request_id, b.request_id], actor=alice,
                              arguments_sha256=a.arguments_sha256)
    assert exc.value.code == "not_identical"
    with pytest.raises(InvalidArguments) as stale:
        approval_bulk_approve(request_ids=[a.request_id], actor=alice, arguments_sha256="0" * 64)
    assert stale.value.code == "stale_arguments"
    response = login(alice).post("/approvals/bulk/", {"request_id": ["nope"], "arguments_sha256": "x"})
    assert response.status_code == 422
    assert not ApprovalRequest.objects.exclude(status="pending").exists()


def test_four_eyes_still_applies_to_each_request_of_a_batch() -> None:
    (alice,) = reviewers(1)
    ok = pending(arguments={"command": "make x"})
    own_session = pending(arguments={"command": "make x"})
    own_session.session.owner = alice
    own_session.session.save(update_fields=["owner"])
    outcomes = approval_bulk_approve(request_ids=[ok.request_id, own_session.request_id], actor=alice,
                                     arguments_sha256=ok.arguments_sha256)
    assert outcomes == {str(ok.request_id): "approved", str(own_session.request_id): "self_approval_forbidden"}


def test_bulk_approval_of_quorum_requests_says_they_still_wait() -> None:
    """An audit: 'Approved 4 of 4' while the quorum requests still waited for a second reviewer."""
    from tests import factories
    from tests.approvals_app.review_helpers import policy

    (alice,) = reviewers(1)
    policy(team=factories.team(), tool_name="run_command", required_approvals=2)
    batch = [pending(arguments={"command": "make release"}) for _ in range(3)]
    browser = login(alice)
    form = {"request_id": [str(a.request_id) for a in batch], "arguments_sha256": batch[0].arguments_sha256}
    shown = browser.post("/approvals/bulk/", form, follow=True).content.decode()
    assert "Approved 0 of 3 identical requests" in shown
    assert "Your approval counted on 3 more, which wait for other reviewers (quorum)." in shown
    assert ApprovalRequest.objects.filter(pk__in=[a.pk for a in batch], status="pending").count() == 3
