"""The airline rebooking desk from the dashboard: the operator starts the demo's batch in one click
on the Batches page, the cases run in parallel with two subagents each, and the reviewer approves the final
rebooking on a page that shows the passengers, flights and seats. Screenshots go to tests/e2e/screenshots
(untracked); the README's copies in docs/screenshots are refreshed from there on purpose."""

from typing import Any

import pytest

from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_decide
from fanout_app.demo_airline import airline_agent_seed
from fanout_app.models import Batch, SubagentLink
from scripted_model.scenarios_airline import AIRLINE_CASES
from sessions_app.models import Turn
from tests import factories
from tests.e2e.conftest import SCREENSHOTS, Stack, World, login, watch_console
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _pending(tool: str, n: int) -> list[ApprovalRequest]:
    def found() -> list[ApprovalRequest] | None:
        rows = list(ApprovalRequest.objects.filter(tool_name=tool, status="pending").order_by("created_at"))
        return rows if len(rows) >= n else None

    result: list[ApprovalRequest] = wait_for(found, 90, f"{n} pending {tool}")
    return result


def test_airline_demo_from_the_dashboard_to_the_reviewers_final_approval(browser: Any, stack: Stack,
                                                                          world: World) -> None:
    airline_agent_seed(team=factories.team(), base_url=stack.model_url, model="scripted-demo")
    operator = login(browser, stack, "operator", viewport={"width": 1280, "height": 900})
    problems = watch_console(operator)
    operator.goto(f"{stack.url}/batches/")
    operator.click("#airline-start")  # one click: the demo's cases as a batch of the rebooking desk
    operator.wait_for_url("**/batches/*-*/")
    batch = Batch.objects.get(title="UA 100 cancelled: rebooking desk")
    assert batch.size == len(AIRLINE_CASES)

    # The sandboxed verification scripts ask first; the operator's reviewer approves them here.
    for tool in ("run_command", "hold_seats"):
        for approval in _pending(tool, 2):
            approval_decide(request_id=approval.request_id, actor=world.reviewer, decision="approve",
                            seen_hash=approval.arguments_sha256)
    rebookings = _pending("rebook_passengers", 2)
    operator.wait_for_selector("#batch-counts dd[data-count=approvals]:has-text('2')")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    operator.screenshot(path=str(SCREENSHOTS / "airline-batch.png"), full_page=True)

    family = Turn.objects.get(session__batch_member__batch=batch, input__contains="FAM-4")
    operator.goto(f"{stack.url}/sessions/{family.session_id}/")
    operator.wait_for_selector(f"#subagents-{family.session_id} .child-card")
    assert len(operator.query_selector_all(f"#subagents-{family.session_id} .child-card")) == 2
    operator.screenshot(path=str(SCREENSHOTS / "airline-session.png"), full_page=True)

    reviewer = login(browser, stack, "reviewer", viewport={"width": 1280, "height": 900})
    for approval in rebookings:
        reviewer.goto(f"{stack.url}/approvals/{approval.request_id}/")
        table = reviewer.inner_text("#rebooking-passengers")
        facts = reviewer.inner_text("#rebooking")
        if approval.arguments["case"] == "FAM-4":
            assert "Sofia Ruiz" in table and "14C" in table and "DL 2290" in facts and "UA 100" in facts
            reviewer.screenshot(path=str(SCREENSHOTS / "airline-rebooking-approval.png"), full_page=True)
        reviewer.click("#approve-form button[value=approve]")
        reviewer.wait_for_url(f"{stack.url}/approvals/")
    def all_done() -> list[Turn] | None:
        turns = list(Turn.objects.filter(session__batch_member__batch=batch))
        return turns if all(not t.is_active for t in turns) else None

    for done in wait_for(all_done, 90, "the cases to finish"):
        assert done.status == "completed", (done.error_code, done.error_message)
    assert SubagentLink.objects.filter(parent__batch_member__batch=batch).count() == 4
    operator.goto(f"{stack.url}/batches/{batch.id}/")
    operator.wait_for_selector("#batch-counts h2:has-text('2 of 2 done')")
    assert not problems, problems
