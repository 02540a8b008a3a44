"""The reviewer's workflow in two browsers (issue 17): one reviewer claims a request and the
other sees the claim live; presence shows who looks at it; a 2-of-2 policy needs both
approvals, and the session resumes only after the second. Screenshots for the README."""

from typing import Any

import pytest

from approvals_app.policies import approval_policy_create
from sessions_app.models import Step, Turn
from tests import factories
from tests.e2e.conftest import PASSWORD, SCREENSHOTS, Stack, World, login, watch_console
from tests.e2e.test_dashboard import start
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def queue(browser: Any, stack: Stack, username: str) -> Any:
    page = login(browser, stack, username)
    page.goto(f"{stack.url}/approvals/")
    page.wait_for_selector("#live-state[data-state=live]")
    return page


def test_two_reviewers_claim_presence_and_a_two_of_two_quorum(browser: Any, stack: Stack, world: World) -> None:
    factories.user("reviewer2", groups=["reviewers"], password=PASSWORD)
    approval_policy_create(name="Commands need two reviewers", team=world.agent.team, tool_name="run_command",
                           required_approvals=2, risk="high",
                           conditions=[{"path": "command", "op": "contains", "value": "deploy"}])
    first = queue(browser, stack, "reviewer")
    second = queue(browser, stack, "reviewer2")
    problems = watch_console(first) + watch_console(second)
    session, quorum = start(world, command="echo deploy > out.txt && cat out.txt", title="deploy")
    _other, single = start(world, command="echo tidy", title="tidy")
    assert (quorum.required_approvals, single.required_approvals) == (2, 1)
    qid = f"#approval-{quorum.request_id}"
    first.wait_for_selector(qid)

    # reviewer claims it; reviewer2 sees who is on it, live
    first.click(f"{qid} button.claim-btn")
    second.wait_for_selector(f"{qid}[data-claimed-by=reviewer]")
    assert "reviewer is on it" in second.inner_text(qid)

    # reviewer2 opens it; the first reviewer's queue shows who is looking
    second.goto(f"{stack.url}/approvals/{quorum.request_id}/")
    second.wait_for_selector("#live-state[data-state=live]")
    assert "Commands need two reviewers" in second.inner_text("#policy-why")
    first.wait_for_selector(f"{qid} [data-presence-for]:has-text('viewing: reviewer2')")

    # the first approval is recorded, the request stays pending and the session waits
    first.click(f"{qid} button[value=approve]")
    second.wait_for_selector(f"#review-{quorum.request_id} .quorum[data-approvals='1']")
    first.wait_for_selector(f"{qid} .quorum")
    assert "1/2 approvals" in first.inner_text(qid)
    assert Step.objects.get(pk=quorum.step_id).status == "awaiting_approval"
    assert Turn.objects.get(pk=quorum.turn_id).status == "awaiting_approval"
    # copied to docs/screenshots for the README
    first.screenshot(path=str(SCREENSHOTS / "review-queue.png"), full_page=True)
    second.screenshot(path=str(SCREENSHOTS / "quorum-request.png"), full_page=True)

    # the second approval decides it; only now does the session resume and run the command
    second.click("#approve-form button[value=approve]")
    step = wait_for(lambda: Step.objects.filter(pk=quorum.step_id, status="completed").first(), timeout=60,
                    what="the command to run after the second approval")
    assert "deploy" in step.result["output"]
    first.wait_for_selector(qid, state="detached")  # gone from the queue, live
    assert not problems, problems
    first.context.close()
    second.context.close()
    assert session.id


def test_the_live_review_card_offers_release_to_the_claimer_and_claim_to_reviewers_only(
        browser: Any, stack: Stack, world: World) -> None:
    """The card pushed live is one copy for every viewer: it lost the claimer's Release button,
    and after a release it offered Claim to the session's operator, who cannot decide (a click:
    403, shown nowhere). Found in a browser audit (2026-12-04)."""
    _session, approval = start(world, command="echo claim", title="claim")
    url = f"{stack.url}/approvals/{approval.request_id}/"
    reviewer, operator = login(browser, stack, "reviewer"), login(browser, stack, "operator")
    for page in (reviewer, operator):
        page.goto(url)
        page.wait_for_selector("#live-state[data-state=live]")
    problems = watch_console(reviewer)
    card = f"#review-{approval.request_id}"
    assert not operator.is_visible(f"{card} .claim-btn")
    reviewer.click(f"{card} .claim-btn")
    reviewer.wait_for_selector(f"{card} .release-btn", state="visible")  # live, without a reload
    operator.wait_for_selector(f"{card} .claimer")
    assert not operator.is_visible(f"{card} .release-btn") and not operator.is_visible(f"{card} .claim-btn")
    reviewer.click(f"{card} .release-btn")
    reviewer.wait_for_selector(f"{card} .claim-btn", state="visible")
    operator.wait_for_selector(f"{card} .claimer", state="detached")
    assert not operator.is_visible(f"{card} .claim-btn")
    assert not problems, problems
    reviewer.context.close()
    operator.context.close()
