"""Batches through the API and the dashboard: all or none, idempotent, filterable, with progress."""

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile

from fanout_app.models import Batch, BatchMember
from sessions_app.models import AgentProfile, AgentSession, Turn
from tests.helpers import api_client, login


def post_batch(client: Any, body: dict[str, Any], key: str = "") -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/api/sessions/batch", json.dumps(body), content_type="application/json", headers=headers)


@pytest.mark.django_db
def test_batch_create_api_starts_one_session_per_row_and_replays_idempotently(operator: User,
                                                                              agent: AgentProfile) -> None:
    client = api_client(operator)
    body = {"agent": agent.slug, "title": "rebook", "rows": [{"input": "case A"}, {"input": "case B", "title": "B"}]}
    first = post_batch(client, body, key="k1")
    assert first.status_code == 201, first.content
    data = first.json()
    assert data["size"] == 2 and [s["title"] for s in data["sessions"]] == ["rebook #1", "B"]
    assert data["progress"]["by_status"] == {"in_progress": 2}
    assert list(Turn.objects.filter(session__batch_member__batch_id=data["id"]).order_by("input")
                .values_list("input", flat=True)) == ["case A", "case B"]
    replay = post_batch(client, body, key="k1")  # the API's Idempotency-Key replays the first response
    assert replay.status_code == 201 and replay.json()["id"] == data["id"]
    assert Batch.objects.count() == 1 and AgentSession.objects.count() == 2
    other = post_batch(client, {**body, "rows": [{"input": "case C"}]}, key="k1")
    assert other.status_code == 422 and Batch.objects.count() == 1
    # The session list filters by batch.
    listed = client.get(f"/api/sessions?batch={data['id']}").json()["items"]
    assert {s["id"] for s in listed} == {s["session_id"] for s in data["sessions"]}
    assert client.get(f"/api/batches/{data['id']}").json()["progress"]["size"] == 2


@pytest.mark.django_db
def test_batch_create_service_is_idempotent_beyond_the_api_replay_window(operator: User, agent: AgentProfile) -> None:
    """The batch row keeps the key: a replay after the API's records expired still starts nothing twice."""
    from agentops.domain import Conflict
    from fanout_app.batches import batch_create

    rows = [{"input": "case A"}]
    batch, created = batch_create(agent=agent, owner=operator, rows=rows, idempotency_key="k2")
    again, created_again = batch_create(agent=agent, owner=operator, rows=rows, idempotency_key="k2")
    assert created and not created_again and again.id == batch.id and AgentSession.objects.count() == 1
    with pytest.raises(Conflict):
        batch_create(agent=agent, owner=operator, rows=[{"input": "case B"}], idempotency_key="k2")


@pytest.mark.django_db
@pytest.mark.parametrize(("rows", "status", "needle"), [
    ([], 422, "non-empty list"),
    ([{"input": "ok"}, {"input": "  "}], 422, "row 1: input must be a non-empty string"),
    ([{"input": "ok"}, {"input": "x", "colour": "red"}], 422, "row 1: unknown fields"),
    ([{"input": "ok"}, {"input": "x", "budget": {"max_tool_calls": -1}}], 422, "row 1: Budget max_tool_calls"),
])
def test_batch_with_an_invalid_row_is_rejected_whole(operator: User, agent: AgentProfile, rows: list[Any],
                                                     status: int, needle: str) -> None:
    response = post_batch(api_client(operator), {"agent": agent.slug, "rows": rows})
    assert response.status_code == status, response.content
    assert needle in response.json()["message"]
    assert not Batch.objects.exists() and not AgentSession.objects.exists()


@pytest.mark.django_db
def test_batch_too_large_is_413(operator: User, agent: AgentProfile, settings: Any) -> None:
    settings.AGENTOPS_BATCH_MAX_ROWS = 3
    response = post_batch(api_client(operator), {"agent": agent.slug, "rows": [{"input": "x"}] * 4})
    assert response.status_code == 413 and not AgentSession.objects.exists()


@pytest.mark.django_db
def test_batch_page_starts_from_an_uploaded_csv_and_shows_progress(operator: User, agent: AgentProfile) -> None:
    client = login(operator)
    upload = SimpleUploadedFile("cases.csv", b"input,title\nrebook the family,Family\nrebook ORD,O'Hare\n")
    response = client.post("/batches/new/", {"agent": agent.slug, "title": "desk", "file": upload})
    assert response.status_code == 302, response.content.decode()[:2000]
    batch = Batch.objects.get()
    assert response["Location"] == f"/batches/{batch.id}/"
    assert list(BatchMember.objects.filter(batch=batch).values_list("session__title", flat=True)) == \
        ["Family", "O'Hare"]
    page = client.get(f"/batches/{batch.id}/").content.decode()
    assert "0 of 2 done" in page and "Family" in page
    bad = client.post("/batches/new/", {"agent": agent.slug, "rows": '[{"input": "ok"}, {"input": ""}]'})
    assert bad.status_code == 422 and "row 1: input must be a non-empty string" in bad.content.decode()
    assert Batch.objects.count() == 1
    # Excel's "CSV UTF-8" starts with a byte-order mark: its header read "\ufeffinput" and was refused.
    excel = SimpleUploadedFile("excel.csv", b"\xef\xbb\xbfinput,title\ncheck seat,Seat\n")
    assert client.post("/batches/new/", {"agent": agent.slug, "title": "xl", "file": excel}).status_code == 302
    assert Batch.objects.count() == 2


def test_a_batchs_progress_counts_its_cancelled_sessions(operator: User, agent: AgentProfile) -> None:
    from sessions_app.engine.commands import session_cancel

    api = api_client(operator)
    created = api.post("/api/sessions/batch", json.dumps({"agent": agent.slug, "rows": [
        {"input": "one"}, {"input": "two"}, {"input": "three"}]}), content_type="application/json")
    assert created.status_code == 201, created.content
    batch = Batch.objects.get()
    for member in BatchMember.objects.filter(batch=batch)[:2]:
        session_cancel(session_id=member.session_id, actor=operator)
    progress = api.get(f"/api/batches/{batch.id}").json()["progress"]
    assert progress["cancelled"] == 2 and progress["completed_sessions"] == 0
    page = login(operator).get(f"/batches/{batch.id}/").content.decode()
    assert '<dd data-count="cancelled">2</dd>' in page


def _waiting_for_approval(session_id: Any) -> Any:
    """The session's queued turn as the engine leaves it at a risky call: running, one tool step
    waiting on a pending approval request."""
    from approvals_app.services import approval_request_create
    from sessions_app.models import Step
    from sessions_app.services import turn_transition

    turn = Turn.objects.get(session_id=session_id)
    step = Step.objects.create(session_id=session_id, turn=turn, index=1, kind=Step.Kind.TOOL,
                               tool_name="write_file", call_id="call_w", arguments={"path": "a.txt", "content": "x"})
    approval = approval_request_create(step_id=step.id, risk="medium")
    turn_transition(turn_id=turn.id, to=Turn.Status.RUNNING)
    turn_transition(turn_id=turn.id, to=Turn.Status.AWAITING_APPROVAL)
    return approval


@pytest.mark.django_db
def test_cancelling_a_batch_cancels_every_working_session_once(operator: User, reviewer: User,
                                                                 agent: AgentProfile) -> None:
    """An operator who fanned out sessions by mistake stops them all at once: each working
    session's turn is cancelled with its pending approval; idle ones are left alone; a second
    cancel does nothing; a reviewer-only member may not; another team's batch is not found."""
    from approvals_app.models import ApprovalRequest
    from sessions_app.engine.commands import session_cancel
    from tests import factories

    api = api_client(operator)
    created = post_batch(api, {"agent": agent.slug, "rows": [{"input": "one"}, {"input": "two"}, {"input": "three"}]})
    assert created.status_code == 201, created.content
    batch = Batch.objects.get()
    first, second, third = [m.session_id for m in BatchMember.objects.filter(batch=batch).order_by("row")]
    approval = _waiting_for_approval(second)
    session_cancel(session_id=third, actor=operator)  # already idle: not counted again

    refused = api_client(reviewer).post(f"/api/batches/{batch.id}/cancel")
    assert refused.status_code == 403, refused.content
    assert Turn.objects.filter(session__batch_member__batch=batch, status__in=Turn.ACTIVE).count() == 2

    outsider = factories.user("outsider", groups=["operators"], teams=["elsewhere"])
    assert api_client(outsider).post(f"/api/batches/{batch.id}/cancel").status_code == 404
    assert api.post("/api/batches/not-a-uuid/cancel").status_code == 404

    response = api.post(f"/api/batches/{batch.id}/cancel")
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["cancelled"] == 2 and data["batch"]["progress"]["cancelled"] == 3
    assert not Turn.objects.filter(session__batch_member__batch=batch, status__in=Turn.ACTIVE).exists()
    assert set(Turn.objects.filter(session_id__in=[first, second]).values_list("error_message", flat=True)) == {
        f"Cancelled by {operator.username}."}
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "cancelled"
    again = api.post(f"/api/batches/{batch.id}/cancel")
    assert again.status_code == 200 and again.json()["cancelled"] == 0


@pytest.mark.django_db
def test_the_batch_page_cancels_its_working_sessions(operator: User, reviewer: User, agent: AgentProfile) -> None:
    created = post_batch(api_client(operator), {"agent": agent.slug, "rows": [{"input": "one"}, {"input": "two"}]})
    batch_id = created.json()["id"]
    browser = login(operator)
    page = browser.get(f"/batches/{batch_id}/").content.decode()
    assert 'id="batch-cancel-form"' in page and "data-confirm=" in page
    assert 'id="batch-cancel-form"' not in login(reviewer).get(f"/batches/{batch_id}/").content.decode()
    assert login(reviewer).post(f"/batches/{batch_id}/cancel/").status_code == 403
    assert browser.get(f"/batches/{batch_id}/cancel/").status_code == 405
    response = browser.post(f"/batches/{batch_id}/cancel/", follow=True)
    assert response.redirect_chain == [(f"/batches/{batch_id}/", 302)]
    body = response.content.decode()
    assert "Cancelled the running turn of 2 sessions." in body and '<dd data-count="cancelled">2</dd>' in body
    again = browser.post(f"/batches/{batch_id}/cancel/", follow=True).content.decode()
    assert "Nothing to cancel: no session of this batch was working." in again
