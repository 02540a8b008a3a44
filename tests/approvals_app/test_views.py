"""The reviewer's pages: queue, decision page, decisions by request id with the hash the page showed."""

import html
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals_app.models import ApprovalGrant, ApprovalRequest
from approvals_app.services import approval_request_create
from sessions_app import services
from sessions_app.fragments import render_event_fragment
from sessions_app.models import AgentProfile, Event, Step
from tests import factories
from tests.helpers import login
from tools_app.models import ToolDefinition
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db

XSS = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'


@pytest.fixture(autouse=True)
def _tools(db: None) -> None:
    tool_definitions_seed()


def make_approval(owner: User, agent: AgentProfile, *, tool: str = "run_command",
                  arguments: dict[str, Any] | None = None, kind: str = "tool", preview: str = "",
                  risk: str = "high", mode: str = "mutating", title: str = "s") -> ApprovalRequest:
    session = factories.session(agent=agent, owner=owner, title=title)
    turn = services.turn_create(session_id=session.id, input="restart the worker", actor=owner)
    step = factories.step(turn, tool_name=tool, arguments=arguments or {"command": "echo hi > out.txt"},
                          approval_mode=mode)
    if kind == "recovery":
        services.step_transition(step_id=step.id, to=Step.Status.RUNNING, event_type="tool.started")
        services.step_transition(step_id=step.id, to=Step.Status.IN_DOUBT, event_type="tool.in_doubt")
    return approval_request_create(step_id=step.id, kind=kind, risk=risk, preview=preview,
                                   sandbox_backend="bubblewrap", network_policy="none", risk_note="writes files")


def test_queue_lists_pending_with_arguments(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent, title="fix prod")
    body = login(reviewer).get("/approvals/").content.decode()
    assert f'id="approval-{approval.request_id}"' in body
    assert "echo hi &gt; out.txt" in body and "fix prod" in body and "restart the worker" in body
    assert 'value="approve"' in body
    assert 'data-ws="/ws/approvals/"' in body


def test_queue_filters_and_order(operator: User, reviewer: User, agent: AgentProfile) -> None:
    first = make_approval(operator, agent, risk="low")
    second = make_approval(operator, agent, tool="write_file", arguments={"path": "a", "content": "b"})
    client = login(reviewer)
    oldest = client.get("/approvals/").content.decode()
    assert oldest.index(str(first.request_id)) < oldest.index(str(second.request_id))
    newest = client.get("/approvals/?order=newest").content.decode()
    assert newest.index(str(second.request_id)) < newest.index(str(first.request_id))
    assert str(first.request_id) not in client.get("/approvals/?tool=write_file").content.decode()
    assert str(second.request_id) not in client.get("/approvals/?risk=low").content.decode()
    other = factories.agent_profile(slug="other")
    assert str(first.request_id) not in client.get(f"/approvals/?agent={other.slug}").content.decode()


@pytest.mark.parametrize("count", [1, 12])
def test_queue_constant_queries(operator: User, reviewer: User, agent: AgentProfile, count: int,
                                django_assert_num_queries: Any) -> None:
    for _ in range(count):
        make_approval(operator, agent)
    client = login(reviewer)
    client.get("/approvals/")
    # session, user, 1 permission read, the queue's page (ids, then rows), tools, agents
    with django_assert_num_queries(7):
        assert client.get("/approvals/").status_code == 200


@pytest.mark.parametrize("order", ["oldest", "newest"])
def test_queue_pages_load_on_scroll_each_request_once(operator: User, reviewer: User, agent: AgentProfile,
                                                      monkeypatch: pytest.MonkeyPatch, order: str) -> None:
    from approvals_app import views

    monkeypatch.setattr(views, "QUEUE_PAGE", 2)
    made = [str(make_approval(operator, agent).request_id) for _ in range(5)]
    client = login(reviewer)
    body = client.get(f"/approvals/?order={order}").content.decode()
    def shown(page: str) -> list[str]:
        return sorted((rid for rid in made if f'id="approval-{rid}"' in page), key=page.index)

    seen = shown(body)
    pages = 1
    while (marker := re.search(r'id="queue-more" hx-get="([^"]+)"', body)) is not None and pages < 10:
        body = client.get(html.unescape(marker.group(1)), headers={"HX-Request": "true"}).content.decode()
        assert "<html" not in body  # a fragment, appended in place of the marker
        seen += shown(body)
        pages += 1
    assert pages == 3
    assert seen == (made if order == "oldest" else made[::-1])


def test_queue_page_without_htmx_is_the_whole_page_and_a_forged_cursor_is_400(
        operator: User, reviewer: User, agent: AgentProfile, monkeypatch: pytest.MonkeyPatch) -> None:
    from approvals_app import views

    monkeypatch.setattr(views, "QUEUE_PAGE", 1)
    made = [str(make_approval(operator, agent).request_id) for _ in range(2)]
    client = login(reviewer)
    more = re.search(r'id="queue-more" hx-get="([^"]+)"', client.get("/approvals/").content.decode())
    assert more is not None
    page = client.get(html.unescape(more.group(1))).content.decode()
    assert "<html" in page and f'id="approval-{made[1]}"' in page and f'id="approval-{made[0]}"' not in page
    assert client.get("/approvals/?after=not-a-cursor").status_code == 400


def test_decision_page_run_command(operator: User, reviewer: User, agent: AgentProfile,
                                   django_assert_num_queries: Any) -> None:
    approval = make_approval(operator, agent, arguments={"command": "make deploy", "cwd": "app",
                                                         "timeout_seconds": 30})
    client = login(reviewer)
    client.get(f"/approvals/{approval.request_id}/")
    # session, user, 1 permission read, approval, viewed-audit throttle, team role, tool, turn steps,
    # approvals of steps, deltas, audit trail, the request's votes (quorum), the subagent lineage
    with django_assert_num_queries(13):
        response = client.get(f"/approvals/{approval.request_id}/")
    body = response.content.decode()
    assert "make deploy" in body and "<code>app</code>" in body and "bubblewrap" in body
    assert "<code>timeout_seconds</code> 30" in body and "<code>memory_bytes</code> 1.0\xa0GB" in body
    assert f'value="{approval.arguments_sha256}"' in body
    assert 'name="arg__command"' in body  # the edit form, from the tool's schema
    assert "Allow <code>run_command</code> for the rest" not in body  # mutating: no grant


def test_decision_page_write_file_shows_diff(operator: User, reviewer: User, agent: AgentProfile) -> None:
    diff = "--- a/x.txt\n+++ b/x.txt\n@@ -1 +1 @@\n-old\n+new <b>"
    approval = make_approval(operator, agent, tool="write_file", arguments={"path": "x.txt", "content": "new"},
                             preview=diff, mode="confirm_once")
    body = login(reviewer).get(f"/approvals/{approval.request_id}/").content.decode()
    assert '<span class="del">-old</span>' in body and '<span class="add">+new &lt;b&gt;</span>' in body
    assert 'name="remember"' in body


def test_approve_from_the_decision_page(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent)
    response = login(reviewer).post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "arguments_sha256": approval.arguments_sha256})
    assert response.status_code == 302 and response["Location"] == "/approvals/"
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED and approval.decided_by == reviewer
    assert approval.seen_sha256 == approval.arguments_sha256
    assert Step.objects.get(pk=approval.step_id).status == Step.Status.APPROVED


def test_stale_page_is_refused(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent)
    response = login(reviewer).post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "arguments_sha256": "0" * 64})
    assert response.status_code == 409
    assert "This page is out of date" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING


def test_missing_hash_is_refused(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent)
    response = login(reviewer).post(f"/approvals/{approval.request_id}/decide/", {"decision": "approve"})
    assert response.status_code == 422
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING


def test_reject_with_reason(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent)
    login(reviewer).post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "reject", "reason": "not on a Friday", "arguments_sha256": approval.arguments_sha256})
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.REJECTED and approval.reason == "not on a Friday"
    assert Step.objects.get(pk=approval.step_id).status == Step.Status.REJECTED


def test_a_reject_needs_a_reason_from_the_queue_as_on_the_decision_page(operator: User, reviewer: User,
                                                                       agent: AgentProfile) -> None:
    """The decision page's reason box is required (the model is told why); the queue's Reject went
    through with none ("Reason: (none given)")."""
    approval = make_approval(operator, agent)
    browser = login(reviewer)
    for extra in ({"from": "queue"}, {}):
        response = browser.post(f"/approvals/{approval.request_id}/decide/", {
            "decision": "reject", "reason": "  ", "arguments_sha256": approval.arguments_sha256, **extra},
            HTTP_HX_REQUEST="true")
        assert response.status_code == 422 and "Say why you reject it" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING


def test_a_decision_posted_again_says_who_decided_and_decides_nothing(operator: User, reviewer: User,
                                                                     agent: AgentProfile) -> None:
    """Back to the cached decision page and Approve again, or a second reviewer on a page out of
    date: both were told "Approved: …" as if they had decided it."""
    approval = make_approval(operator, agent)
    first = login(reviewer)
    page = first.get(f"/approvals/{approval.request_id}/")
    assert "no-store" in page["Cache-Control"]  # Back fetches the page again: it is not kept
    form = {"decision": "approve", "arguments_sha256": approval.arguments_sha256}
    assert first.post(f"/approvals/{approval.request_id}/decide/", form).status_code == 302
    second = login(factories.user("rev2", groups=["reviewers"]))
    for browser, who in ((first, reviewer.username), (second, reviewer.username)):
        response = browser.post(f"/approvals/{approval.request_id}/decide/", form, follow=True)
        text = html.unescape(response.content.decode())
        assert f"Already decided: approved by {who}" in text and "Nothing more was done." in text, text[:2000]
    assert Event.objects.filter(type="approval.decided").count() == 1


def test_edit_arguments_typed_by_schema(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent)
    login(reviewer).post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "edit": "1", "arguments_sha256": approval.arguments_sha256,
        "arg__command": "echo safer\r\necho two", "arg__cwd": "", "arg__timeout_seconds": "20"})
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    assert approval.edited_arguments == {"command": "echo safer\necho two", "timeout_seconds": 20}
    assert Step.objects.get(pk=approval.step_id).arguments == approval.edited_arguments


def test_edit_arguments_revalidated_server_side(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent)
    client = login(reviewer)
    response = client.post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "edit": "1", "arguments_sha256": approval.arguments_sha256,
        "arg__command": "", "arg__timeout_seconds": "0"})
    assert response.status_code == 422
    assert "timeout_seconds" in response.content.decode()
    response = client.post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "edit": "1", "arguments_sha256": approval.arguments_sha256,
        "arg__command": "ls", "arg__timeout_seconds": "soon"})
    assert response.status_code == 422
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING


def test_allow_tool_for_the_session(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent, tool="write_file", arguments={"path": "a", "content": "b"},
                             mode="confirm_once")
    login(reviewer).post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "remember": "1", "arguments_sha256": approval.arguments_sha256})
    assert ApprovalGrant.objects.filter(session_id=approval.session_id, tool_name="write_file").exists()


def test_recovery_request_offers_retry_mark_done_fail(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent, kind="recovery")
    client = login(reviewer)
    body = client.get(f"/approvals/{approval.request_id}/").content.decode()
    assert 'value="retry"' in body and 'value="mark_done"' in body and 'value="fail"' in body
    assert 'value="approve"' not in body
    client.post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "mark_done", "arguments_sha256": approval.arguments_sha256})
    assert Step.objects.get(pk=approval.step_id).status == Step.Status.COMPLETED


def test_without_permission_no_buttons_and_403(operator: User, agent: AgentProfile) -> None:
    approval = make_approval(factories.user("owner2", groups=["operators"]), agent)
    client = login(operator)
    body = client.get(f"/approvals/{approval.request_id}/").content.decode()
    assert 'value="approve"' not in body and 'value="reject"' not in body
    assert 'value="approve"' not in client.get("/approvals/").content.decode()
    response = client.post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "arguments_sha256": approval.arguments_sha256})
    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING


def test_self_approval_is_refused(agent: AgentProfile) -> None:
    both = factories.user("both", groups=["operators", "reviewers"])
    approval = make_approval(both, agent)
    response = login(both).post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "arguments_sha256": approval.arguments_sha256})
    assert response.status_code == 403


def test_decide_needs_csrf(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent)
    client = Client(enforce_csrf_checks=True)
    client.force_login(reviewer)
    response = client.post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "arguments_sha256": approval.arguments_sha256})
    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING


def test_one_click_from_the_queue_with_htmx(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent)
    client = login(reviewer)
    stale = client.post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "from": "queue", "arguments_sha256": "f" * 64}, headers={"HX-Request": "true"})
    assert stale.status_code == 409 and "out of date" in stale.content.decode()
    assert stale["HX-Retarget"] == f"#approval-{approval.request_id}"
    assert stale["HX-Reswap"] == "outerHTML"
    response = client.post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "from": "queue", "arguments_sha256": approval.arguments_sha256},
        headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert f'id="decided-{approval.request_id}"' in response.content.decode()
    assert f'<div id="approval-{approval.request_id}" hx-swap-oob="delete">' in response.content.decode()


def test_arguments_with_html_render_as_text(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent, arguments={"command": XSS}, title=XSS)
    client = login(reviewer)
    for url in ("/approvals/", f"/approvals/{approval.request_id}/"):
        body = client.get(url).content.decode()
        assert "<script>alert(1)" not in body and "<img src=x" not in body
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    event = Event.objects.get(session_id=approval.session_id, type="approval.requested")
    html = render_event_fragment(event.as_dict())
    assert "<script>alert(1)" not in html and "<img src=x" not in html
    assert f'data-target="#approval-queue" data-seq="{event.seq}" data-id="approval-{approval.request_id}"' in html


def test_decided_fragment_removes_the_queue_item(operator: User, reviewer: User, agent: AgentProfile) -> None:
    approval = make_approval(operator, agent)
    login(reviewer).post(f"/approvals/{approval.request_id}/decide/", {
        "decision": "approve", "arguments_sha256": approval.arguments_sha256})
    event = Event.objects.get(session_id=approval.session_id, type="approval.decided")
    html = render_event_fragment(event.as_dict())
    assert f'data-op="remove" data-target="#approval-queue" data-seq="{event.seq}" ' \
           f'data-id="approval-{approval.request_id}"' in html
    # the step's card, pushed with it, says who decided (its step was asked about: its approval is read)
    assert f"approved by {reviewer.username}" in html
    assert ToolDefinition.objects.filter(name="run_command").exists()


def test_decision_page_shows_bidi_and_control_characters_visibly(operator: User, reviewer: User,
                                                                  agent: AgentProfile) -> None:
    # "Trojan Source": U+202E makes `rm -rf ~ #` look like something else on screen.
    command = "echo safe \u202e# ~ fr- mr\u202c; rm -rf ~\u200b\x1b[2K"
    approval = make_approval(operator, agent, arguments={"command": command})
    body = login(reviewer).get(f"/approvals/{approval.request_id}/").content.decode()
    assert 'id="hidden-chars-warning"' in body
    for code in ("U+202E", "U+202C", "U+200B", "U+001B"):
        assert f"⟨{code}⟩" in body, code
    assert 'title="RIGHT-TO-LEFT OVERRIDE"' in body
    command_block = body.split('<pre class="mono cmd">')[1].split("</pre>")[0]
    assert "\u202e" not in command_block and "\u200b" not in command_block and "\x1b" not in command_block
    plain = make_approval(operator, agent, arguments={"command": "echo héllo\tworld"}, title="plain")
    body = login(reviewer).get(f"/approvals/{plain.request_id}/").content.decode()
    assert "hidden-chars-warning" not in body and "⟨U+" not in body


def test_the_queue_card_shows_hidden_characters_and_offers_no_one_click_approve(operator: User, reviewer: User,
                                                                                  agent: AgentProfile) -> None:
    """A sandbox audit: the queue card rendered U+202E/U+2066 raw, Chromium showed
    `echo ok  #  ; rm -rf logs` (the rm as if commented out), and its one-click Approve ran it."""
    command = "echo ok \u202e\u2066 ; rm -rf logs \u2069\u2066 # \u2069\u202c"
    tricky = make_approval(operator, agent, arguments={"command": command})
    plain = make_approval(operator, agent, arguments={"command": "echo ok"}, title="plain")
    body = login(reviewer).get("/approvals/").content.decode()
    card = body.split(f'id="approval-{tricky.request_id}"')[1].split("</article>")[0]
    assert "\u202e" not in card and "\u2066" not in card and "⟨U+202E⟩" in card and "hidden-chars" in card
    assert 'value="approve"' not in card and 'value="reject"' in card
    plain_card = body.split(f'id="approval-{plain.request_id}"')[1].split("</article>")[0]
    assert 'value="approve"' in plain_card and "hidden-chars" not in plain_card
