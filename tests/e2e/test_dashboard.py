"""The dashboard end to end: daphne + a Celery worker + the scripted model, driven by Chromium.

An operator and a reviewer work in two browser contexts; nothing is ever reloaded by hand: every
change arrives over the WebSockets.
"""

import json
from typing import Any

import pytest

from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_decide
from sessions_app.engine.commands import session_start
from sessions_app.models import AgentSession, Event, Step
from tests.e2e.conftest import SCREENSHOTS, Stack, World, login, watch_console
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

COMMAND = "echo hi > out.txt && cat out.txt"


def script(command: str = COMMAND) -> str:
    return f"tool run_command {json.dumps({'command': command})}\nsay done: {{results}}"




def pending_request(session_id: Any) -> ApprovalRequest:
    return wait_for(lambda: ApprovalRequest.objects.filter(session_id=session_id, status="pending").first(),
                    what="an approval request")


def session_page(browser: Any, stack: Stack, session_id: Any) -> Any:
    """The operator's page of one session, its live connection up."""
    page = login(browser, stack, "operator")
    page.goto(f"{stack.url}/sessions/{session_id}/")
    page.wait_for_selector("#live-state[data-state=live]")
    return page


def rendered_seq(page: Any) -> int:
    """The last seq the page has applied, as live.js keeps it on the live root."""
    return int(page.get_attribute("[data-live]", "data-last-seq") or 0)


def mark_no_reload(page: Any) -> None:
    page.evaluate("window.__noReload = true")


def assert_not_reloaded(page: Any) -> None:
    assert page.evaluate("window.__noReload === true"), "the page was reloaded"


def test_operator_and_reviewer_live(browser: Any, stack: Stack, world: World) -> None:
    reviewer = login(browser, stack, "reviewer")
    reviewer_problems = watch_console(reviewer)
    reviewer.goto(f"{stack.url}/approvals/")
    reviewer.wait_for_selector("#live-state[data-state=live]")
    mark_no_reload(reviewer)

    operator = login(browser, stack, "operator")
    operator_problems = watch_console(operator)
    operator.goto(f"{stack.url}/sessions/")
    operator.select_option("#new-session select[name=agent]", "scripted")
    operator.fill("textarea[name=input]", script())
    operator.click("#new-session details summary")
    operator.fill("textarea[name=requirements]", "Only touch the workspace")
    operator.fill("input[name=title]", "Write out.txt")
    operator.click("#new-session button[type=submit]")
    operator.wait_for_url("**/sessions/*-*/")
    operator.wait_for_selector("#live-state[data-state=live]")
    mark_no_reload(operator)
    fetched: list[str] = []  # everything an event changes comes with it: the page fetches nothing
    operator.on("request", lambda r: fetched.append(r.url) if r.resource_type in ("xhr", "fetch") else None)
    session = AgentSession.objects.get(title="Write out.txt")
    # "started N s ago" stays true while the page is open (re-counted every second, not every 15 s)
    started = operator.inner_text("main time[data-rel]")
    wait_for(lambda: operator.inner_text("main time[data-rel]") != started, timeout=4, what="the start time to tick")

    # The request appears in the reviewer's queue without a reload, with the exact arguments.
    item = reviewer.wait_for_selector("#approval-queue .qitem")
    assert COMMAND in item.inner_text()
    assert "Write out.txt" in item.inner_text()
    assert_not_reloaded(reviewer)
    reviewer.screenshot(path=str(SCREENSHOTS / "approvals.png"), full_page=True)

    # The operator's timeline shows the step waiting for approval.
    operator.wait_for_selector(".step.k-tool.s-awaiting_approval")
    operator.wait_for_selector("#session-status.s-awaiting_approval")

    reviewer.click("#approval-queue .qitem a.button")
    reviewer.wait_for_selector("#approve-form")
    shown = json.loads(reviewer.inner_text("#arguments"))
    approval = pending_request(session.id)
    assert shown == approval.arguments == {"command": COMMAND}
    assert COMMAND in reviewer.inner_text("pre.cmd")
    reviewer.screenshot(path=str(SCREENSHOTS / "decision.png"), full_page=True)
    reviewer.click("#approve-form button[value=approve]")
    reviewer.wait_for_url(f"{stack.url}/approvals/")
    assert "Approved" in reviewer.inner_text(".messages")

    # The operator sees the tool run and the answer stream in, still without a reload.
    card = operator.wait_for_selector(".step.k-tool.s-completed")
    assert "out.txt" in card.inner_text()
    final = operator.wait_for_selector(".step.final .answer")  # rendered from Markdown once complete
    wait_for(lambda: "done:" in final.inner_text(), what="the final answer")
    assert "hi" in final.inner_text()
    operator.wait_for_selector("#session-status.s-idle")
    assert_not_reloaded(operator)
    session.refresh_from_db()
    wait_for(lambda: rendered_seq(operator) == AgentSession.objects.get(
        pk=session.id).last_seq, what="the page to render every event")
    assert operator.locator(".step.k-tool").count() == 1
    assert "Only touch the workspace" in operator.inner_text(".pinned")
    operator.wait_for_selector("#controls button.primary:not([disabled])")  # the pushed sidebar
    assert operator.inner_text("#sidebar .bar-row >> nth=0").split() == ["Tool", "calls", "1", "/", "20"]
    assert fetched == []
    operator.screenshot(path=str(SCREENSHOTS / "session.png"), full_page=True)
    operator.goto(f"{stack.url}/sessions/")
    operator.screenshot(path=str(SCREENSHOTS / "sessions.png"), full_page=True)
    operator.goto(f"{stack.url}/")
    health = operator.wait_for_selector("#health ul.health")
    assert "workers" in health.inner_text()
    operator.screenshot(path=str(SCREENSHOTS / "overview.png"), full_page=True)

    phone = login(browser, stack, "operator", viewport={"width": 390, "height": 844}, is_mobile=True)
    phone.goto(f"{stack.url}/sessions/{session.id}/")
    phone.wait_for_selector(".step.final")
    phone.screenshot(path=str(SCREENSHOTS / "session-phone.png"), full_page=True)
    phone.context.close()

    assert not [p for p in reviewer_problems + operator_problems if "Content Security Policy" in p]
    reviewer.context.close()
    operator.context.close()


def start(world: World, command: str = COMMAND, title: str = "s") -> tuple[AgentSession, ApprovalRequest]:
    session, _turn = session_start(agent=world.agent, owner=world.operator, input=script(command), title=title)
    return session, pending_request(session.id)


def test_reject_with_reason(browser: Any, stack: Stack, world: World) -> None:
    session, approval = start(world)
    operator = session_page(browser, stack, session.id)
    reviewer = login(browser, stack, "reviewer")
    reviewer.goto(f"{stack.url}/approvals/{approval.request_id}/")
    reviewer.fill("#reject-form textarea[name=reason]", "not on a Friday")
    reviewer.click("#reject-form button[value=reject]")
    reviewer.wait_for_url(f"{stack.url}/approvals/")
    card = operator.wait_for_selector(".step.k-tool.s-rejected")
    assert "not on a Friday" in card.inner_text()
    operator.wait_for_selector(".step.final")
    approval.refresh_from_db()
    assert approval.status == "rejected" and approval.reason == "not on a Friday"
    assert not Step.objects.filter(pk=approval.step_id, status="completed").exists()
    reviewer.context.close()
    operator.context.close()


def test_edit_arguments_then_approve(browser: Any, stack: Stack, world: World) -> None:
    session, approval = start(world)
    reviewer = login(browser, stack, "reviewer")
    reviewer.goto(f"{stack.url}/approvals/{approval.request_id}/")
    reviewer.click("details.edit summary")
    reviewer.fill("#edit-form textarea[name=arg__command]", "echo edited > out.txt && cat out.txt")
    reviewer.fill("#edit-form input[name=arg__timeout_seconds]", "0")
    reviewer.click("#edit-form button[value=approve]")
    # Re-validated server-side against the tool's schema: refused, the form stays open.
    assert "timeout_seconds" in reviewer.inner_text("body")
    reviewer.fill("#edit-form textarea[name=arg__command]", "echo edited > out.txt && cat out.txt")
    reviewer.fill("#edit-form input[name=arg__timeout_seconds]", "20")
    reviewer.click("#edit-form button[value=approve]")
    reviewer.wait_for_url(f"{stack.url}/approvals/")
    step = wait_for(lambda: Step.objects.filter(pk=approval.step_id, status="completed").first(),
                    what="the edited command to run")
    assert step.arguments == {"command": "echo edited > out.txt && cat out.txt", "timeout_seconds": 20}
    assert "edited" in step.result["output"]
    operator = session_page(browser, stack, session.id)
    assert "(arguments edited)" in operator.inner_text(f"#step-{step.id}")
    reviewer.context.close()
    operator.context.close()


def test_stale_page_is_refused(browser: Any, stack: Stack, world: World) -> None:
    _session, approval = start(world)
    reviewer = login(browser, stack, "reviewer")
    reviewer.goto(f"{stack.url}/approvals/{approval.request_id}/")
    # What the page shows is no longer what would run (e.g. the sandbox policy changed).
    ApprovalRequest.objects.filter(pk=approval.pk).update(arguments_sha256="0" * 64)
    reviewer.click("#approve-form button[value=approve]")
    assert "This page is out of date" in reviewer.inner_text("#decision-error")
    approval.refresh_from_db()
    assert approval.status == "pending"
    reviewer.screenshot(path=str(SCREENSHOTS / "decision-stale.png"), full_page=True)
    reviewer.context.close()


def test_xss_payload_is_shown_as_text(browser: Any, stack: Stack, world: World) -> None:
    payload = '<script>window.__xss=1</script>"><img src=x onerror="window.__xss=2">'
    reviewer = login(browser, stack, "reviewer")
    reviewer.goto(f"{stack.url}/approvals/")
    reviewer.wait_for_selector("#live-state[data-state=live]")
    session, approval = start(world, command=f"echo '{payload}'", title=payload)
    item = reviewer.wait_for_selector(f"#approval-{approval.request_id}")  # pushed live
    assert payload in item.inner_text()
    reviewer.goto(f"{stack.url}/approvals/{approval.request_id}/")
    assert payload in reviewer.inner_text("pre.cmd")
    assert json.loads(reviewer.inner_text("#arguments")) == {"command": f"echo '{payload}'"}
    # One click from the queue (htmx, CSRF from the body's hx-headers).
    reviewer.goto(f"{stack.url}/approvals/")
    reviewer.click(f"#approval-{approval.request_id} button[value=approve]")
    reviewer.wait_for_selector(f"#decided-{approval.request_id}")
    operator = session_page(browser, stack, session.id)
    final = operator.wait_for_selector(".step.final .answer-raw", state="attached")  # the raw text, beside the Markdown
    wait_for(lambda: payload in (final.text_content() or ""), what="the payload echoed back as text")
    for page in (reviewer, operator):
        assert page.evaluate("window.__xss === undefined")
        assert page.locator("img[src=x]").count() == 0
    reviewer.context.close()
    operator.context.close()


def test_reconnect_after_daphne_restart_shows_missed_events_once(browser: Any, stack: Stack, world: World) -> None:
    session, approval = start(world)
    operator = session_page(browser, stack, session.id)
    operator.wait_for_selector(".step.k-tool.s-awaiting_approval")
    mark_no_reload(operator)
    seen_before = rendered_seq(operator)

    stack.kill("web")
    operator.wait_for_selector("#live-state[data-state=off]")
    approval_decide(request_id=approval.request_id, actor=world.reviewer, decision="approve",
                    seen_hash=approval.arguments_sha256)
    wait_for(lambda: AgentSession.objects.get(pk=session.id).status == "idle", what="the turn to finish")
    last_seq = AgentSession.objects.get(pk=session.id).last_seq
    assert last_seq > seen_before

    stack.start_web()
    wait_for(lambda: rendered_seq(operator) == last_seq, what="the missed events")
    assert_not_reloaded(operator)
    assert operator.locator(".step.k-tool").count() == 1
    assert operator.locator(".step.k-model").count() == 2
    answer = operator.text_content(".step.final .answer-raw")  # the raw text, beside the Markdown
    expected = Step.objects.filter(session_id=session.id, kind="model").order_by("-created_at").first()
    assert expected is not None and answer == expected.message["content"]
    deltas = "".join(e.payload["text"] for e in Event.objects.filter(session_id=session.id, type="model.delta",
                                                                     step_id=expected.id).order_by("seq"))
    assert deltas in ("", answer)  # streamed text, when there was some, was shown once
    operator.context.close()


def test_gap_in_seq_is_filled_from_the_database(browser: Any, stack: Stack, world: World) -> None:
    from django.db import transaction

    from sessions_app import services
    from tests import factories

    session = factories.session(agent=world.agent, owner=world.operator, title="gaps")
    operator = session_page(browser, stack, session.id)
    # An event the channel layer lost: stored, never announced.
    with transaction.atomic():
        row = AgentSession.objects.select_for_update().get(pk=session.id)
        Event.objects.create(session=row, seq=row.last_seq + 1, type="note.lost", payload={})
        AgentSession.objects.filter(pk=row.pk).update(last_seq=row.last_seq + 1)
    after = services.event_record(session_id=session.id, type="session.status_changed", payload={"status": "failed"})
    # The page sees seq n+1 arrive after n-1, asks for n, then applies both in order.
    wait_for(lambda: rendered_seq(operator) == after.seq, what="the gap to be filled")
    assert operator.inner_text("#session-status") == "Failed"
    operator.context.close()
