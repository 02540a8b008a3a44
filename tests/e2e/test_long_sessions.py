"""Long-session features in the browser: a running command's live output and progress bar on the
operator's timeline and on the reviewer's decision page, the final answer as Markdown, and the
retry button after a budget is raised. daphne + a Celery worker + the gateway + the scripted model,
driven by Chromium; nothing is reloaded by hand."""

import json
from typing import Any

import pytest

from approvals_app.services import approval_decide
from sessions_app.engine.commands import session_start
from sessions_app.models import Step, Turn
from tests.e2e.conftest import SCREENSHOTS, Stack, World, login, watch_console
from tests.e2e.test_dashboard import assert_not_reloaded, mark_no_reload, pending_request, session_page
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

COMMAND = ('for i in $(seq 1 16); do echo "built part $i"; '
           'echo "@@progress {\\"done\\": $i, \\"total\\": 16, \\"note\\": \\"parts\\"}"; sleep 0.4; done')


def _bar_value(page: Any, step_id: Any) -> int:
    value = page.get_attribute(f"#step-{step_id}-progress progress", "value")
    return int(value or 0)


def test_live_command_output_and_progress_bar_then_markdown_answer(browser: Any, stack: Stack,
                                                                   world: World) -> None:
    call = f"tool run_command {json.dumps({'command': COMMAND})}"
    session, turn = session_start(agent=world.agent, owner=world.operator, title="Build parts",
                                  input=f"{call}\nsay **Built** all parts with `make`: {{results}}")
    assert turn is not None
    approval = pending_request(session.id)
    operator = session_page(browser, stack, session.id)
    operator_problems = watch_console(operator)
    mark_no_reload(operator)
    reviewer = login(browser, stack, "reviewer")
    reviewer_problems = watch_console(reviewer)
    reviewer.goto(f"{stack.url}/approvals/{approval.request_id}/")
    reviewer.wait_for_selector("#live-state[data-state=live]")
    mark_no_reload(reviewer)

    approval_decide(request_id=approval.request_id, actor=world.reviewer, decision="approve",
                    seen_hash=approval.arguments_sha256)
    step_id = approval.step_id
    # The card appears running (pushed), then its output and bar move while the command runs.
    for page in (operator, reviewer):
        page.wait_for_selector(f"#step-{step_id}-progress progress", timeout=20_000)
        # A locator, not wait_for_function: the page's CSP (script-src 'self') refuses the eval that
        # wait_for_function's polling needs whenever the text is not there on the first look.
        page.locator(f"#step-{step_id}-live", has_text="built part 2").wait_for(timeout=20_000)
    first = _bar_value(operator, step_id)
    wait_for(lambda: _bar_value(operator, step_id) > first, 15, "the progress bar to advance")
    assert Step.objects.get(pk=step_id).status == "running"
    assert "@@progress" not in (operator.text_content(f"#step-{step_id}-live") or "")
    operator.screenshot(path=str(SCREENSHOTS / "live-progress.png"), full_page=True)
    reviewer.screenshot(path=str(SCREENSHOTS / "live-progress-reviewer.png"), full_page=True)
    assert _bar_value(reviewer, step_id) > 0

    # The answer, once the turn completes, as Markdown (bold, code), with the raw text beside it.
    operator.wait_for_selector(".step.final .answer.markdown strong", timeout=30_000)
    assert operator.text_content(".step.final .answer.markdown strong") == "Built"
    assert operator.text_content(".step.final .answer.markdown code") == "make"
    assert "**Built**" in (operator.text_content(".step.final .answer-raw") or "")
    wait_for(lambda: Turn.objects.get(pk=turn.id).status == "completed", 30, "the turn to complete")
    operator.screenshot(path=str(SCREENSHOTS / "markdown-answer.png"), full_page=True)
    assert_not_reloaded(operator)
    assert_not_reloaded(reviewer)
    assert not operator_problems and not reviewer_problems, (operator_problems, reviewer_problems)


def test_raise_the_budget_then_retry_from_the_page(browser: Any, stack: Stack, world: World) -> None:
    call = 'tool list_files {"path": "."}'
    session, turn = session_start(agent=world.agent, owner=world.operator, title="Over budget",
                                  budget={"max_tool_calls": 1}, input=f"{call}\n{call}\nsay finished")
    assert turn is not None
    wait_for(lambda: Turn.objects.get(pk=turn.id).status == "failed", 30, "the turn to cross its budget")
    operator = session_page(browser, stack, session.id)
    operator.fill("#budget input[name=max_tool_calls]", "5")
    with operator.expect_navigation():
        operator.click("#budget button[type=submit]")
    operator.wait_for_selector("#live-state[data-state=live]")
    assert operator.get_attribute("#budget input[name=max_tool_calls]", "placeholder") == "5"
    with operator.expect_navigation():
        operator.click(f"#turn-{turn.id}-foot .retry-form button")
    operator.wait_for_selector(f"#turn-{turn.id} .step.final", timeout=30_000)
    # The answer step commits first; the turn completes in the engine's next tick.
    wait_for(lambda: Turn.objects.get(pk=turn.id).status == "completed", 30, "the retried turn to complete")
    assert operator.query_selector(f"#turn-{turn.id}-foot .retry-form") is None
