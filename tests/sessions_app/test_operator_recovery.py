"""Operators recover a stopped session: raise its budget (``budget.raised``) and retry a failed,
retryable turn, through the API (idempotent with ``Idempotency-Key``) and the dashboard's form
and button; both need the permission to operate sessions."""

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from sessions_app.engine.budgets import Budget
from sessions_app.engine.commands import session_start
from sessions_app.engine.turns import turn_fail, turn_fail_budget
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from sessions_app.services import turn_create
from tests import factories
from tests.helpers import api_client, finished, login, script, tool


def _post(client: Client, url: str, body: dict[str, Any] | None = None, key: str = "") -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post(url, json.dumps(body or {}), content_type="application/json", headers=headers)


def _failed_turn(owner: User, *, retryable: bool = True, code: str = "model_unavailable") -> Turn:
    session = factories.session(owner=owner, budget={"max_tool_calls": 3})
    turn = turn_create(session_id=session.id, input="go")
    failed = turn_fail(turn_id=turn.id, code=code, message="it stopped", retryable=retryable)
    assert failed is not None
    return failed


@pytest.mark.usefixtures("workers")
def test_operator_raises_the_budget_and_retries_the_turn_that_crossed_it(
        engine_agent: AgentProfile, operator: User) -> None:
    session, turn = session_start(agent=engine_agent, owner=operator, budget={"max_tool_calls": 1},
                                  input=script(tool("list_files", path="."), tool("list_files", path="."),
                                               "say done after {results}"))
    assert turn is not None
    turn = finished(turn)
    assert turn.status == "failed" and turn.error_code == "budget_exceeded" and turn.retryable
    api = api_client(operator)

    raised = _post(api, f"/api/sessions/{session.id}/budget", {"max_tool_calls": 5}, key="raise-1")
    assert raised.status_code == 200, raised.content
    assert raised.json()["budget"]["max_tool_calls"] == 5
    again = _post(api, f"/api/sessions/{session.id}/budget", {"max_tool_calls": 5}, key="raise-1")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    (event,) = Event.objects.filter(session=session, type="budget.raised")
    assert event.payload == {"before": {"max_tool_calls": 1}, "after": {"max_tool_calls": 5}, "by": operator.username}

    retried = _post(api, f"/api/turns/{turn.id}/retry", key="retry-1")
    assert retried.status_code == 200, retried.content
    assert retried.json()["id"] == str(turn.id) and retried.json()["status"] == "queued"
    replay = _post(api, f"/api/turns/{turn.id}/retry", key="retry-1")
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    turn = finished(turn)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert turn.output_text.startswith("done after") and turn.error_code == ""
    assert Event.objects.filter(turn=turn, type="turn.retried").count() == 1
    # The retry went on from where the turn stopped: its steps are kept, the next model call is new.
    steps = list(Step.objects.filter(turn=turn).order_by("index").values_list("kind", "status", "error_code"))
    assert steps == [("model", "completed", ""), ("tool", "completed", ""), ("model", "completed", ""),
                     ("tool", "failed", "budget_exceeded"), ("model", "completed", "")]


@pytest.mark.django_db
def test_a_turn_its_budget_failed_is_not_retried_until_that_budget_is_raised(operator: User) -> None:
    """A retry with the tool calls still used up ran the model again, asked a reviewer to approve a
    call, and failed the approved call on the budget (a browser audit, 2026-12-04)."""
    session = factories.session(owner=operator, budget={"max_tool_calls": 2, "max_tokens": 1000})
    turn = turn_create(session_id=session.id, input="go")
    AgentSession.objects.filter(pk=session.pk).update(tool_calls=2)
    turn_fail_budget(turn_id=turn.id, session_id=session.id, budget=Budget("max_tool_calls", 2, 2))
    api = api_client(operator)
    refused = _post(api, f"/api/turns/{turn.id}/retry")
    assert refused.status_code == 409, refused.content
    assert refused.json()["code"] == "budget_still_exceeded"
    assert refused.json()["message"] == "Raise the budget first: Tool calls is limited to 2 and 2 are used."
    browser = login(operator)
    page = browser.post(f"/sessions/{session.id}/turns/{turn.id}/retry/", follow=True).content.decode()
    assert "Raise the budget first" in page
    assert Turn.objects.get(pk=turn.pk).status == "failed"
    assert not Event.objects.filter(turn=turn, type="turn.retried").exists()
    # Another budget raised does not help; this one does.
    assert _post(api, f"/api/sessions/{session.id}/budget", {"max_tokens": 5000}).status_code == 200
    assert _post(api, f"/api/turns/{turn.id}/retry").status_code == 409
    assert _post(api, f"/api/sessions/{session.id}/budget", {"max_tool_calls": 3}).status_code == 200
    assert _post(api, f"/api/turns/{turn.id}/retry").status_code == 200
    assert Turn.objects.get(pk=turn.pk).status == "queued"


@pytest.mark.django_db
def test_turn_retry_api_without_a_key_is_idempotent_too(operator: User) -> None:
    turn = _failed_turn(operator)
    api = api_client(operator)
    first = _post(api, f"/api/turns/{turn.id}/retry")
    second = _post(api, f"/api/turns/{turn.id}/retry")
    assert first.status_code == second.status_code == 200
    assert Event.objects.filter(turn=turn, type="turn.retried").count() == 1
    row = Turn.objects.get(pk=turn.pk)
    assert row.status == "queued" and row.started_at is None and row.finished_at is None and not row.retryable
    assert AgentSession.objects.get(pk=turn.session_id).status == "in_progress"


@pytest.mark.django_db
def test_turn_retry_refuses_what_cannot_be_retried(operator: User) -> None:
    api = api_client(operator)
    fatal = _failed_turn(operator, retryable=False, code="authentication_error")
    response = _post(api, f"/api/turns/{fatal.id}/retry")
    assert response.status_code == 409 and response.json()["code"] == "not_retryable"
    older = _failed_turn(operator)
    turn_create(session_id=older.session_id, input="next")  # a later turn exists
    response = _post(api, f"/api/turns/{older.id}/retry")
    assert response.status_code == 409 and response.json()["code"] == "not_retryable"
    assert _post(api, "/api/turns/nope/retry").status_code == 404
    assert not Event.objects.filter(type="turn.retried").exists()


@pytest.mark.django_db
def test_budget_raise_refuses_lowering_and_unknown_fields(operator: User) -> None:
    session = factories.session(owner=operator, budget={"max_tool_calls": 3})
    api = api_client(operator)
    lowered = _post(api, f"/api/sessions/{session.id}/budget", {"max_tool_calls": 2})
    assert lowered.status_code == 422 and lowered.json()["code"] == "budget_lowered"
    assert _post(api, f"/api/sessions/{session.id}/budget", {"max_tool_calls": -1}).status_code == 422
    capped = _post(api, f"/api/sessions/{session.id}/budget", {"max_tokens": 1000})  # no limit → 1000: lower
    assert capped.status_code == 422 and capped.json()["details"]["fields"] == ["max_tokens"]
    assert _post(api, f"/api/sessions/{session.id}/budget", {"max_turns": 5}).status_code == 422
    lifted = _post(api, f"/api/sessions/{session.id}/budget", {"max_tool_calls": None})
    assert lifted.status_code == 200
    assert lifted.json()["budget"] == {"max_tool_calls": None, "max_model_calls": None, "max_tokens": None,
                                       "max_wall_seconds": None}
    same = _post(api, f"/api/sessions/{session.id}/budget", {"max_tool_calls": None})
    assert same.status_code == 200
    assert Event.objects.filter(session=session, type="budget.raised").count() == 1


@pytest.mark.django_db
def test_recovery_needs_the_permission_to_operate(operator: User, reviewer: User) -> None:
    turn = _failed_turn(operator)
    api = api_client(reviewer)
    assert _post(api, f"/api/turns/{turn.id}/retry").status_code == 403
    assert _post(api, f"/api/sessions/{turn.session_id}/budget", {"max_tool_calls": 9}).status_code == 403
    browser = login(reviewer)
    assert browser.post(f"/sessions/{turn.session_id}/turns/{turn.id}/retry/").status_code == 403
    assert browser.post(f"/sessions/{turn.session_id}/budget/", {"max_tool_calls": "9"}).status_code == 403
    assert Turn.objects.get(pk=turn.pk).status == "failed"
    assert AgentSession.objects.get(pk=turn.session_id).max_tool_calls == 3
    assert not Event.objects.filter(type__in=["turn.retried", "budget.raised"]).exists()


@pytest.mark.django_db
def test_dashboard_retry_button_and_budget_form(operator: User) -> None:
    turn = _failed_turn(operator)
    browser = login(operator)
    page = browser.get(f"/sessions/{turn.session_id}/").content.decode()
    retry_url = f"/sessions/{turn.session_id}/turns/{turn.id}/retry/"
    assert re.search(rf'<form method="post" action="{retry_url}"', page)
    assert 'name="max_tool_calls"' in page and 'placeholder="3"' in page
    response = browser.post(f"/sessions/{turn.session_id}/budget/", {"max_tool_calls": "10", "max_tokens": ""})
    assert response.status_code == 302
    assert AgentSession.objects.get(pk=turn.session_id).max_tool_calls == 10
    assert browser.post(retry_url).status_code == 302
    assert Turn.objects.get(pk=turn.pk).status == "queued"
    page = browser.get(f"/sessions/{turn.session_id}/").content.decode()
    assert retry_url not in page  # queued again: nothing to retry


@pytest.mark.django_db
def test_the_page_says_when_a_retried_turn_is_still_at_work(operator: User) -> None:
    """A tenancy audit: Retry posted again on a turn waiting for its approval said "The turn runs
    again." and nothing happened (the retry of an active turn is a replay)."""
    turn = _failed_turn(operator)
    browser = login(operator)
    url = f"/sessions/{turn.session_id}/turns/{turn.id}/retry/"
    first = browser.post(url, follow=True).content.decode()
    assert "The turn runs again." in first and Turn.objects.get(pk=turn.pk).status == "queued"
    again = browser.post(url, follow=True).content.decode()
    assert "This turn is still at work: nothing to retry." in again and "The turn runs again." not in again
    assert Event.objects.filter(turn=turn, type="turn.retried").count() == 1
