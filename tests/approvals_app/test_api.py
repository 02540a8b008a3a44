"""The approvals JSON API: the queue, one request by its request_id, and decisions (incl. races)."""

import hashlib
import json
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentops.domain import Conflict
from approvals_app import grants, services
from approvals_app.models import ApprovalGrant, ApprovalRequest
from sessions_app.models import Event, Step, Turn
from tests import factories
from tests.concurrency import run_together
from tests.helpers import api_client
from tools_app.services import tool_definitions_seed

NumQueries = Callable[..., Any]


def _pending(*, owner: User | None = None, turn: Turn | None = None, tool_name: str = "run_command",
             arguments: dict[str, Any] | None = None, approval_mode: str = "mutating") -> ApprovalRequest:
    """A pending request without running the engine: session, turn, tool step, then the request."""
    tool_definitions_seed()
    if turn is None:
        turn = factories.turn(factories.session(owner=owner or factories.user(groups=["operators"])))
    step = factories.step(turn, tool_name=tool_name, call_id=f"call_{uuid.uuid4().hex[:8]}",
                          arguments=arguments if arguments is not None else {"command": "rm -rf build"},
                          approval_mode=approval_mode)
    return services.approval_request_create(step_id=step.id)


def _decisions(approval: ApprovalRequest) -> int:
    return Event.objects.filter(session_id=approval.session_id, type="approval.decided").count()


def _decide(api: Client, approval: ApprovalRequest, **body: Any) -> Any:
    body.setdefault("arguments_sha256", approval.arguments_sha256)
    return api.post(f"/api/approvals/{approval.request_id}/decision", body, content_type="application/json")


@pytest.fixture
def approval(db: None) -> ApprovalRequest:
    return _pending()


# --- the queue and one request -----------------------------------------------------------------------------------

@pytest.mark.django_db
def test_approvals_list_api_filters_by_status_session_and_tool(reviewer: User,
                                                               django_assert_num_queries: NumQueries) -> None:
    first = _pending()
    second = _pending(tool_name="write_file", arguments={"path": "a.txt", "content": "x"})
    third = _pending(turn=first.turn)
    services.approval_decide(request_id=third.request_id, actor=reviewer, decision="reject", reason="no")
    api = api_client(reviewer)

    def ids(query: str) -> list[str]:
        response = api.get(f"/api/approvals{query}")
        assert response.status_code == 200, response.content
        return [item["request_id"] for item in response.json()["items"]]

    assert ids("") == [str(third.request_id), str(second.request_id), str(first.request_id)]
    assert ids("?status=pending") == [str(second.request_id), str(first.request_id)]
    assert ids("?status=rejected") == [str(third.request_id)]
    assert ids(f"?session={first.session_id}") == [str(third.request_id), str(first.request_id)]
    assert ids("?tool=write_file") == [str(second.request_id)]
    assert ids(f"?status=pending&session={first.session_id}&tool=run_command") == [str(first.request_id)]
    assert ids("?session=garbage") == []

    for _ in range(3):
        _pending()
    # token lookup, one permission read, one page (decider and session joined): no query per row
    with django_assert_num_queries(3):
        response = api.get("/api/approvals")
    items = response.json()["items"]
    assert len(items) == 6
    assert {i["decided_by"] for i in items} == {None, "rev"}


@pytest.mark.django_db
def test_approvals_list_api_cursor_and_bad_filters(reviewer: User) -> None:
    created = [_pending() for _ in range(5)]
    api = api_client(reviewer)
    seen: list[str] = []
    cursor = ""
    while True:
        page = api.get(f"/api/approvals?limit=2{'&cursor=' + cursor if cursor else ''}").json()
        seen += [i["request_id"] for i in page["items"]]
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert seen == [str(a.request_id) for a in reversed(created)]

    unknown = api.get("/api/approvals?status=maybe")
    assert unknown.status_code == 422 and unknown.json()["code"] == "invalid_arguments"
    assert api.get("/api/approvals?cursor=abc").status_code == 400


@pytest.mark.django_db
def test_approval_get_api_shows_what_the_reviewer_decides_on(reviewer: User, approval: ApprovalRequest) -> None:
    response = api_client(reviewer).get(f"/api/approvals/{approval.request_id}")
    assert response.status_code == 200
    body = response.json()
    assert body["request_id"] == str(approval.request_id) and body["status"] == "pending"
    assert body["tool_name"] == "run_command" and body["arguments"] == {"command": "rm -rf build"}
    assert body["arguments_sha256"] == approval.arguments_sha256 and len(body["arguments_sha256"]) == 64
    assert body["session_id"] == str(approval.session_id) and body["step_id"] == str(approval.step_id)
    assert body["decided_by"] is None and body["expires_at"] is not None
    # The run spec the hash is over (an audit: API reviewers could not see a call's environment
    # and secrets, nor recompute the hash): its canonical JSON hashes to arguments_sha256.
    spec = body["run_spec"]
    assert spec["arguments"] == {"command": "rm -rf build"} and spec["tool"] == "run_command" and "limits" in spec
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert hashlib.sha256(canonical).hexdigest() == body["arguments_sha256"]


@pytest.mark.django_db
@pytest.mark.parametrize("request_id", [pytest.param(str(uuid.uuid4()), id="unknown-uuid"), "garbage", "42"])
def test_approval_api_unknown_request_id_is_404(reviewer: User, approval: ApprovalRequest, request_id: str) -> None:
    api = api_client(reviewer)
    response = api.get(f"/api/approvals/{request_id}")
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    response = api.post(f"/api/approvals/{request_id}/decision", {"decision": "approve"},
                        content_type="application/json")
    assert response.status_code == 404
    assert set(response.json()) == {"code", "message", "details"} and response.json()["code"] == "not_found"
    assert _decisions(approval) == 0


# --- decisions ---------------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_approval_decide_api_approve_records_one_decision(reviewer: User, approval: ApprovalRequest) -> None:
    response = _decide(api_client(reviewer), approval, decision="approve", reason="looks fine",
                       arguments_sha256=approval.arguments_sha256)
    assert response.status_code == 200, response.content
    body = response.json()
    approval.refresh_from_db()
    assert body["status"] == approval.status == "approved" and body["decision"] == "approve"
    assert body["decided_by"] == "rev" and approval.decided_by == reviewer and approval.decided_at is not None
    assert approval.reason == "looks fine" and approval.seen_sha256 == approval.arguments_sha256
    assert Step.objects.get(pk=approval.step_id).status == "approved"
    assert _decisions(approval) == 1


@pytest.mark.django_db
def test_approval_decide_api_reject_settles_the_step(reviewer: User, approval: ApprovalRequest) -> None:
    response = _decide(api_client(reviewer), approval, decision="reject", reason="too dangerous")
    assert response.status_code == 200
    assert response.json()["status"] == "rejected"
    step = Step.objects.get(pk=approval.step_id)
    assert step.status == "rejected" and step.result is not None and "too dangerous" in step.result["output"]


@pytest.mark.django_db
def test_approval_decide_api_same_decision_replayed_is_200_and_one_decision(reviewer: User,
                                                                           approval: ApprovalRequest) -> None:
    api = api_client(reviewer)
    first = _decide(api, approval, decision="approve")
    second = _decide(api, approval, decision="approve")
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert _decisions(approval) == 1


@pytest.mark.django_db
def test_approval_decide_api_other_decision_after_a_decision_is_409(reviewer: User,
                                                                   approval: ApprovalRequest) -> None:
    api = api_client(reviewer)
    assert _decide(api, approval, decision="reject").status_code == 200
    response = _decide(api, approval, decision="approve")
    assert response.status_code == 409
    assert response.json()["code"] == "already_decided"
    assert response.json()["details"] == {"status": "rejected", "decision": "reject"}
    approval.refresh_from_db()
    assert approval.status == "rejected" and _decisions(approval) == 1


@pytest.mark.django_db
def test_approval_decide_api_stale_hash_is_409_and_changes_nothing(reviewer: User,
                                                                  approval: ApprovalRequest) -> None:
    response = _decide(api_client(reviewer), approval, decision="approve", arguments_sha256="0" * 64)
    assert response.status_code == 409
    assert response.json()["code"] == "stale_arguments"
    assert response.json()["details"] == {"current_sha256": approval.arguments_sha256, "seen_sha256": "0" * 64}
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.decided_by is None and _decisions(approval) == 0


@pytest.mark.django_db
@pytest.mark.parametrize("groups", [["operators"], []])
def test_approval_decide_api_without_permission_is_403(approval: ApprovalRequest, groups: list[str]) -> None:
    outsider = factories.user("outsider", groups=groups)
    response = _decide(api_client(outsider), approval, decision="approve")
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    approval.refresh_from_db()
    assert approval.status == "pending" and _decisions(approval) == 0
    assert Step.objects.get(pk=approval.step_id).status == "awaiting_approval"


@pytest.mark.django_db
def test_approval_decide_api_session_owner_cannot_approve_own_request() -> None:
    owner = factories.user("both", groups=["operators", "reviewers"])
    approval = _pending(owner=owner)
    response = _decide(api_client(owner), approval, decision="approve")
    assert response.status_code == 403
    assert response.json()["code"] == "self_approval_forbidden"
    approval.refresh_from_db()
    assert approval.status == "pending" and _decisions(approval) == 0


@pytest.mark.django_db
@pytest.mark.parametrize("decision", ["retry", "mark_done", "fail"])
def test_approval_decide_api_recovery_decision_on_a_tool_request_is_422(reviewer: User, approval: ApprovalRequest,
                                                                        decision: str) -> None:
    response = _decide(api_client(reviewer), approval, decision=decision)
    assert response.status_code == 422
    assert response.json()["details"] == {"field": "decision", "allowed": ["approve", "reject"]}
    approval.refresh_from_db()
    assert approval.status == "pending"


@pytest.mark.django_db
@pytest.mark.parametrize("body", [{}, {"decision": "maybe"}, {"decision": "approve", "arguments_sha256": "abc"},
                                  {"decision": "approve", "remember": "sometimes"},
                                  {"decision": "approve", "arguments": ["ls"]}])
def test_approval_decide_api_wrong_types_are_422(reviewer: User, approval: ApprovalRequest,
                                                 body: dict[str, Any]) -> None:
    response = api_client(reviewer).post(f"/api/approvals/{approval.request_id}/decision", body,
                                   content_type="application/json")
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_arguments"
    approval.refresh_from_db()
    assert approval.status == "pending"


@pytest.mark.django_db
@pytest.mark.parametrize("arguments", [{}, {"command": 42}, {"command": "ls", "surprise": True}])
def test_approval_decide_api_edited_arguments_must_match_the_tool_schema(reviewer: User, approval: ApprovalRequest,
                                                                         arguments: dict[str, Any]) -> None:
    response = _decide(api_client(reviewer), approval, decision="approve", arguments=arguments)
    assert response.status_code == 422, response.content
    assert response.json()["code"] == "invalid_arguments" and response.json()["details"]["errors"]
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert Step.objects.get(pk=approval.step_id).arguments == {"command": "rm -rf build"}


@pytest.mark.django_db
def test_approval_decide_api_edited_arguments_keep_both_versions(reviewer: User, approval: ApprovalRequest) -> None:
    response = _decide(api_client(reviewer), approval, decision="approve", arguments={"command": "rm -rf build/tmp"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["arguments"] == {"command": "rm -rf build"}
    assert body["edited_arguments"] == {"command": "rm -rf build/tmp"}
    assert Step.objects.get(pk=approval.step_id).arguments == {"command": "rm -rf build/tmp"}
    payload = Event.objects.get(session_id=approval.session_id, type="approval.decided").payload
    assert payload["edited_arguments"] == {"command": "rm -rf build/tmp"}


@pytest.mark.django_db
def test_approval_decide_api_remember_on_confirm_once_creates_a_grant(reviewer: User) -> None:
    approval = _pending(tool_name="write_file", arguments={"path": "a.txt", "content": "x"},
                        approval_mode="confirm_once")
    response = _decide(api_client(reviewer), approval, decision="approve", remember=True)
    assert response.status_code == 200, response.content
    assert response.json()["remember"] is True
    grant = ApprovalGrant.objects.get(session_id=approval.session_id, tool_name="write_file")
    assert grant.granted_by == reviewer and grant.source_request_id == approval.pk
    assert grant.arguments_sha256 == grants.args_sha256({"path": "a.txt", "content": "x"})
    assert grant.turn_id == approval.turn_id and grant.argument_pattern is None


@pytest.mark.django_db
def test_approval_decide_api_remember_on_a_mutating_tool_is_422(reviewer: User, approval: ApprovalRequest) -> None:
    response = _decide(api_client(reviewer), approval, decision="approve", remember=True)
    assert response.status_code == 422 and response.json()["details"] == {"field": "remember"}
    assert ApprovalGrant.objects.count() == 0
    approval.refresh_from_db()
    assert approval.status == "pending"


# --- races against PostgreSQL ------------------------------------------------------------------------------------

def _race(approval: ApprovalRequest, actors_and_decisions: list[tuple[User, str]]) -> list[str]:
    """Decide from several threads at once; returns each thread's outcome ("ok" or the error code)."""
    def decide(actor: User, decision: str) -> str:
        try:
            services.approval_decide(request_id=approval.request_id, actor=actor, decision=decision)
            return "ok"
        except Conflict as exc:
            return exc.code

    return run_together([partial(decide, actor, decision) for actor, decision in actors_and_decisions])


@pytest.mark.django_db(transaction=True)
def test_approval_decide_double_click_records_exactly_one_decision() -> None:
    reviewer = factories.user("race-rev", groups=["reviewers"])
    approval = _pending()
    assert _race(approval, [(reviewer, "approve")] * 4) == ["ok"] * 4  # a double click is a replay, not an error
    approval.refresh_from_db()
    assert approval.status == "approved" and _decisions(approval) == 1


@pytest.mark.django_db(transaction=True)
def test_approval_decide_approve_and_reject_racing_one_wins_the_other_409() -> None:
    first = factories.user("race-a", groups=["reviewers"])
    second = factories.user("race-b", groups=["reviewers"])
    approval = _pending()
    outcomes = _race(approval, [(first, "approve"), (second, "reject")])
    assert sorted(outcomes) == ["already_decided", "ok"]
    approval.refresh_from_db()
    assert approval.status in ("approved", "rejected") and _decisions(approval) == 1
    expected_step = "approved" if approval.decision == "approve" else "rejected"
    assert Step.objects.get(pk=approval.step_id).status == expected_step


@pytest.mark.django_db
def test_approval_decide_past_deadline_records_the_expiry_and_refuses() -> None:
    from datetime import timedelta


    step = factories.step(factories.turn(), tool_name="run_command", arguments={"command": "true"},
                          approval_mode="mutating")
    approval = services.approval_request_create(step_id=step.id)
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    reviewer = factories.user("late-reviewer", groups=["reviewers"])
    with pytest.raises(Conflict) as info:
        services.approval_decide(request_id=approval.request_id, actor=reviewer, decision="approve")
    assert info.value.code == "expired"
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "expired"  # not rolled back with the refusal
    assert Step.objects.get(pk=step.pk).status == "expired"
    assert Event.objects.filter(step_id=step.id, type="approval.expired").count() == 1


@pytest.mark.django_db
def test_approval_decide_api_without_arguments_sha256_is_422_unless_relaxed(reviewer: User, settings: Any) -> None:
    approval = _pending()
    response = _decide(api_client(reviewer), approval, decision="approve", arguments_sha256=None)
    assert response.status_code == 422 and response.json()["code"] == "arguments_sha256_required"
    approval.refresh_from_db()
    assert approval.status == "pending" and _decisions(approval) == 0
    settings.AGENTOPS_API_REQUIRE_ARGUMENTS_SHA256 = False
    assert _decide(api_client(reviewer), approval, decision="approve", arguments_sha256=None).status_code == 200


def test_a_single_approval_decision_reads_no_votes_and_no_separate_expiry(reviewer: User) -> None:
    """A request one approval decides: its vote is written, never read back or counted (a pending
    single-approval request holds no vote), its deadline is checked on the row already read, and the
    answer is the row the decision wrote."""
    approval = _pending()
    client = api_client(reviewer)
    with CaptureQueriesContext(connection) as queries:
        response = client.post(f"/api/approvals/{approval.request_id}/decision", content_type="application/json",
                               data={"decision": "approve", "arguments_sha256": approval.arguments_sha256})
    assert response.status_code == 200 and response.json()["status"] == "approved"
    votes = [q["sql"] for q in queries.captured_queries if "approvals_app_approvalvote" in q["sql"]]
    assert len(votes) == 1 and votes[0].startswith("INSERT")
    assert not [q for q in queries.captured_queries if '"expires_at" <=' in q["sql"]]
    selects = [q for q in queries.captured_queries
               if q["sql"].startswith("SELECT") and "FROM \"approvals_app_approvalrequest\"" in q["sql"]]
    # Read to check the reviewer, then its session id and the row under lock; not again for the answer.
    assert len(selects) == 3, [q["sql"] for q in selects]
    # PostgreSQL numbers the event and inserts it in one statement (a CTE); SQLite takes two.
    assert len(queries.captured_queries) <= (17 if connection.vendor == "postgresql" else 18)
