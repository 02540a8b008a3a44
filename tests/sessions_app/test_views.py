"""Dashboard pages for sessions: access, content, escaping, CSRF, constant query counts."""

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

from approvals_app.models import ApprovalRequest
from sessions_app import services
from sessions_app.fragments import SIDEBAR_TYPES, render_event_fragment, render_event_fragments
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from tests import factories
from tests.helpers import login

pytestmark = pytest.mark.django_db

XSS = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'


def add_turn_with_steps(session: AgentSession, *, steps: int, text: str = "ok") -> Turn:
    """A completed turn: one model step and ``steps`` finished tool steps, with their events."""
    turn = services.turn_create(session_id=session.id, input=f"do {text}", actor=session.owner)
    services.turn_transition(turn_id=turn.id, to=Turn.Status.RUNNING)
    model = factories.step(turn, kind="model", tool_name="", message={"role": "assistant", "content": "thinking"})
    services.step_transition(step_id=model.id, to=Step.Status.RUNNING, event_type="model.started")
    services.event_record(session_id=session.id, turn_id=turn.id, step_id=model.id, type="model.delta",
                          payload={"text": "thin"})
    services.step_transition(step_id=model.id, to=Step.Status.COMPLETED, event_type="model.completed")
    for _ in range(steps):
        step = factories.step(turn, tool_name="run_command", arguments={"command": f"echo {text}"})
        services.step_transition(step_id=step.id, to=Step.Status.RUNNING, event_type="tool.started")
        services.step_transition(step_id=step.id, to=Step.Status.COMPLETED, event_type="tool.completed",
                                 result={"status": "completed", "output": f"{text}\nline2", "exit_code": 0,
                                         "duration_ms": 12.5, "files_changed": {"created": ["out.txt"]}})
    services.turn_transition(turn_id=turn.id, to=Turn.Status.COMPLETED, output_text=f"answer {text}")
    services.session_transition(session_id=session.id, to=AgentSession.Status.IDLE)
    return turn


def test_pages_require_login() -> None:
    client = Client()
    for url in ("/", "/sessions/", "/approvals/"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/")


def test_login_page_logs_in(operator: User) -> None:
    client = Client()
    response = client.post("/login/", {"username": "op", "password": "pw"})
    assert response.status_code == 302
    assert client.get("/").status_code == 200


def test_overview_counts_and_oldest_approval(operator: User, agent: AgentProfile,
                                             django_assert_num_queries: Any) -> None:
    session = factories.session(agent=agent, owner=operator, title="busy one")
    services.turn_create(session_id=session.id, input="go")
    factories.session(agent=agent, owner=operator)
    client = login(operator)
    client.get("/")  # warm the permission cache of the session
    with django_assert_num_queries(8):  # session, user, 1 permission read, 5 dashboard reads
        response = client.get("/")
    body = response.content.decode()
    assert response.status_code == 200
    assert re.search(r'<span class="n">1</span> running', body)
    assert "No pending approvals." in body
    assert "busy one" in body


def _waiting_session(operator: User, agent: AgentProfile, title: str, turn_status: str, step_status: str,
                     *, minutes: int, tool_name: str = "run_command") -> AgentSession:
    session = factories.session(agent=agent, owner=operator, title=title)
    turn = services.turn_create(session_id=session.id, input="go")
    services.turn_transition(turn_id=turn.id, to="running")
    step = factories.step(turn, tool_name=tool_name)
    Step.objects.filter(pk=step.pk).update(status=step_status)
    if turn_status != "running":
        services.turn_transition(turn_id=turn.id, to=turn_status)
    AgentSession.objects.filter(pk=session.pk).update(
        last_event_at=timezone.now() - timedelta(minutes=minutes))
    return session


def test_overview_stuck_list_covers_every_waiting_state_with_age_and_reason(
        operator: User, agent: AgentProfile, django_assert_num_queries: Any) -> None:
    _waiting_session(operator, agent, "needs a reviewer", "awaiting_approval", "awaiting_approval", minutes=75)
    _waiting_session(operator, agent, "needs the client", "requires_action", "running", minutes=20,
                     tool_name="lookup_customer")
    _waiting_session(operator, agent, "lost its tick", "running", "approved", minutes=12)
    _waiting_session(operator, agent, "fresh approval", "awaiting_approval", "awaiting_approval", minutes=1)
    client = login(operator)
    client.get("/")
    with django_assert_num_queries(9):  # as below, plus the stuck sessions' blocking steps
        body = client.get("/").content.decode()
    rows = re.findall(r'<li class="stuck-row">(.*?)</li>', body, re.S)
    assert len(rows) == 3
    assert "needs a reviewer" in rows[0] and "1 h 15 min" in rows[0]
    assert "waiting for a reviewer to decide run_command" in rows[0]
    assert "needs the client" in rows[1] and "20 min" in rows[1] and "output of lookup_customer" in rows[1]
    assert "lost its tick" in rows[2] and "12 min" in rows[2] and "not picked up yet" in rows[2]
    assert "fresh approval" not in "".join(rows)


def test_overview_shows_admin_link_only_to_staff(operator: User) -> None:
    assert "/admin/" not in login(operator).get("/").content.decode()
    admin = factories.user("boss", groups=["admins"], is_staff=True)
    assert 'href="/admin/"' in login(admin).get("/").content.decode()


def test_health_panel_renders(operator: User) -> None:
    response = login(operator).get("/health-panel/")
    assert response.status_code == 200
    assert "database" in response.content.decode()


def test_session_list_filters_and_paginates(operator: User, reviewer: User, agent: AgentProfile) -> None:
    other_agent = factories.agent_profile(name="Other", slug="other")
    for i in range(30):
        factories.session(agent=agent, owner=operator, title=f"mine {i}")
    factories.session(agent=other_agent, owner=reviewer, title="needle in title")
    with_input = factories.session(agent=agent, owner=operator, title="plain")
    services.turn_create(session_id=with_input.id, input="find the haystack please")
    client = login(operator)

    first = client.get("/sessions/").content.decode()
    assert "page 1 of 2" in first
    assert "needle in title" in client.get("/sessions/?agent=other").content.decode()
    assert "mine 3" not in client.get("/sessions/?agent=other").content.decode()
    assert "needle in title" in client.get("/sessions/?owner=rev").content.decode()
    searched = client.get("/sessions/?q=haystack").content.decode()
    assert "plain" in searched and "mine 1" not in searched
    assert "plain" in client.get("/sessions/?status=in_progress").content.decode()
    partial = client.get("/sessions/?q=needle", headers={"HX-Request": "true", "HX-Target": "session-results"})
    assert "<html" not in partial.content.decode() and "needle in title" in partial.content.decode()


@pytest.mark.parametrize("count", [2, 40])
def test_session_list_constant_queries(operator: User, agent: AgentProfile, count: int,
                                       django_assert_num_queries: Any) -> None:
    for _ in range(count):
        factories.session(agent=agent, owner=operator)
    client = login(operator)
    client.get("/sessions/")
    # session, user, 1 permission read, count, page, agents (filter), owners (filter), agents (form)
    with django_assert_num_queries(8):
        assert client.get("/sessions/?q=x").status_code == 200


def test_new_session_form_starts_a_session(operator: User, agent: AgentProfile) -> None:
    client = login(operator)
    response = client.post("/sessions/new/", {
        "agent": agent.slug, "title": "", "input": "say hello",
        "requirements": "be brief\n\nbe kind", "prohibitions": "no network", "acceptance_criteria": "",
    })
    session = AgentSession.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/sessions/{session.id}/"
    assert session.owner == operator
    assert session.requirements == ["be brief", "be kind"] and session.prohibitions == ["no network"]
    assert Turn.objects.get(session=session).input == "say hello"
    page = client.get(response["Location"]).content.decode()
    assert "Pinned context" in page and "be brief" in page and "no network" in page


def test_a_new_session_form_posted_twice_starts_one_session(operator: User, agent: AgentProfile) -> None:
    """A double click on "Start session" (30 ms apart in Chromium) started two sessions. The form
    carries a key of its rendering; a second post of it goes where the first one went."""
    client = login(operator)
    key = re.search(r'name="submission_key" value="([0-9a-f]{32})"', client.get("/sessions/").content.decode())
    assert key is not None
    refused = client.post("/sessions/new/", {"agent": agent.slug, "input": "", "submission_key": key[1]})
    assert refused.status_code == 422 and not AgentSession.objects.exists()  # sent back: the key stays free
    form = {"agent": agent.slug, "input": "say hello", "submission_key": key[1]}
    first, second = client.post("/sessions/new/", form), client.post("/sessions/new/", form)
    session = AgentSession.objects.get()
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"] == f"/sessions/{session.id}/"
    assert second["Idempotent-Replayed"] == "true"
    assert client.post("/sessions/new/", {**form, "submission_key": "another"}).status_code == 302
    assert AgentSession.objects.count() == 2  # another rendering of the form is another session
    assert login(factories.user("olga", groups=["operators"])).post("/sessions/new/", form).status_code == 302
    assert AgentSession.objects.count() == 3  # a key belongs to who posted it
    assert client.get("/sessions/new/")["Location"] == "/sessions/"  # the URL an error page leaves shown


def test_new_session_form_reports_errors(operator: User, agent: AgentProfile) -> None:
    response = login(operator).post("/sessions/new/", {"agent": agent.slug, "input": ""})
    assert response.status_code == 422
    assert AgentSession.objects.count() == 0


def test_reviewer_cannot_start_sessions(reviewer: User, agent: AgentProfile) -> None:
    client = login(reviewer)
    assert 'id="new-session"' not in client.get("/sessions/").content.decode()
    assert client.post("/sessions/new/", {"agent": agent.slug, "input": "x"}).status_code == 403


def test_forms_need_csrf(operator: User, agent: AgentProfile) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.post("/sessions/new/", {"agent": agent.slug, "input": "x"}).status_code == 403
    page = client.get("/sessions/").content.decode()
    assert 'name="csrfmiddlewaretoken"' in page
    assert 'hx-headers=\'{"X-CSRFToken": "' in page


def test_session_page_shows_timeline(operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator, title="timeline",
                                pinned={"acceptance_criteria": ["tests pass"]})
    add_turn_with_steps(session, steps=2)
    response = login(operator).get(f"/sessions/{session.id}/")
    body = response.content.decode()
    session.refresh_from_db()
    assert response.status_code == 200
    assert f'data-last-seq="{session.last_seq}"' in body
    assert f'data-ws="/ws/sessions/{session.id}/"' in body
    assert "tests pass" in body
    assert body.count('class="step k-tool') == 2
    assert "echo ok" in body and "exit 0" in body and "out.txt" in body and "answer ok" in body
    assert "Tool calls" in body  # usage bars


def test_session_page_csp_has_no_inline_script(operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator)
    response = login(operator).get(f"/sessions/{session.id}/")
    assert "script-src 'self'" in response["Content-Security-Policy"]
    body = response.content.decode()
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", body) == []
    assert " style=" not in body
    assert " on" + "click=" not in body


@pytest.mark.parametrize("turns", [1, 8])
def test_session_page_constant_queries(operator: User, agent: AgentProfile, turns: int,
                                       django_assert_num_queries: Any) -> None:
    session = factories.session(agent=agent, owner=operator)
    for i in range(turns):
        add_turn_with_steps(session, steps=1 + i, text=f"t{i}")
    client = login(operator)
    client.get(f"/sessions/{session.id}/")
    # session, user, 1 permission read, the session row, turns, steps, approvals, streamed deltas,
    # notes (pinned edits, compaction requests), artifacts, grants, subagent lineage and children
    with django_assert_num_queries(13):
        response = client.get(f"/sessions/{session.id}/")
    assert response.status_code == 200
    body = response.content.decode()
    # Long timelines paginate by turns.
    assert ("Load earlier turns" in body) == (turns > 5)


def test_earlier_turns_page(operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator)
    for i in range(7):
        add_turn_with_steps(session, steps=0, text=f"t{i}")
    body = login(operator).get(f"/sessions/{session.id}/timeline/?before=3").content.decode()
    assert "Turn 1" in body and "Turn 2" in body and "Turn 3" not in body


def test_streaming_text_is_folded_into_a_running_model_step(operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator)
    turn = services.turn_create(session_id=session.id, input="stream")
    model = factories.step(turn, kind="model", tool_name="")
    services.step_transition(step_id=model.id, to=Step.Status.RUNNING, event_type="model.started")
    for chunk in ("Hel", "lo ", "world"):
        last = services.event_record(session_id=session.id, turn_id=turn.id, step_id=model.id, type="model.delta",
                                     payload={"text": chunk})
    body = login(operator).get(f"/sessions/{session.id}/").content.decode()
    assert f'id="step-{model.id}-stream" data-seq="{last.seq}">Hello world</div>' in body


def test_tool_arguments_and_output_are_escaped(operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator, title=XSS)
    turn = services.turn_create(session_id=session.id, input=XSS)
    step = factories.step(turn, tool_name="run_command", arguments={"command": XSS})
    services.step_transition(step_id=step.id, to=Step.Status.RUNNING, event_type="tool.started")
    services.step_transition(step_id=step.id, to=Step.Status.FAILED, event_type="tool.failed",
                             result={"status": "failed", "output": XSS, "error_code": "timeout"},
                             error_code="timeout", error_message=XSS)
    body = login(operator).get(f"/sessions/{session.id}/").content.decode()
    assert "<script>alert(1)" not in body and "<img src=x" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "timeout" in body
    for event in Event.objects.filter(session=session):
        html = render_event_fragment(event.as_dict())
        assert "<script>alert" not in html and "<img src=x" not in html


def test_turn_submit_and_cancel(operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator)
    client = login(operator)
    response = client.post(f"/sessions/{session.id}/turns/", {"input": "first"})
    assert response.status_code == 302
    assert Turn.objects.get(session=session).input == "first"
    # A second input while the first runs is refused with a message, not a crash.
    client.post(f"/sessions/{session.id}/turns/", {"input": "second"})
    assert Turn.objects.filter(session=session).count() == 1
    page = client.get(f"/sessions/{session.id}/").content.decode()
    assert "already has an active turn" in page
    assert "Cancel the running turn" in page
    client.post(f"/sessions/{session.id}/cancel/")
    assert Turn.objects.get(session=session).status == Turn.Status.CANCELLED


def test_reviewer_sees_no_operator_controls(reviewer: User, operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator)
    client = login(reviewer)
    assert "Next input" not in client.get(f"/sessions/{session.id}/").content.decode()
    assert client.post(f"/sessions/{session.id}/turns/", {"input": "x"}).status_code == 403
    assert client.post(f"/sessions/{session.id}/cancel/").status_code == 403


def test_artifact_download(operator: User, agent: AgentProfile, settings: Any) -> None:
    session = factories.session(agent=agent, owner=operator)
    root = Path(settings.AGENTOPS_ARTIFACT_ROOT)
    stored = root / "a" / "report.html"
    stored.parent.mkdir(parents=True)
    stored.write_text("<script>x</script>")
    artifact = services.artifact_record(session_id=session.id, path="report.html", size=18, sha256="ab" * 32,
                                        storage_path=str(stored))
    client = login(operator)
    page = client.get(f"/sessions/{session.id}/").content.decode()
    assert f"/sessions/{session.id}/artifacts/{artifact.id}/" in page
    response = client.get(f"/sessions/{session.id}/artifacts/{artifact.id}/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/octet-stream"
    assert "attachment" in response["Content-Disposition"]
    assert response["X-Content-Type-Options"] == "nosniff"
    assert b"".join(response.streaming_content) == b"<script>x</script>"  # type: ignore[attr-defined]


def test_fragments_target_the_page_partials(operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator)
    turn = add_turn_with_steps(session, steps=1)
    events = {e.type: e for e in Event.objects.filter(session=session).order_by("seq")}
    queued = render_event_fragment(events["turn.queued"].as_dict())
    assert 'data-op="upsert" data-target="#timeline"' in queued and f'id="turn-{turn.id}"' in queued
    delta = render_event_fragment(events["model.delta"].as_dict())
    assert 'data-op="append-text"' in delta and ">thin</template>" in delta
    tool = render_event_fragment(events["tool.completed"].as_dict())
    assert f'data-target="#turn-{turn.id}-items"' in tool and "exit 0" in tool
    status = render_event_fragment(events["session.status_changed"].as_dict())
    assert 'data-op="replace" data-target="#session-status"' in status


def test_session_page_renders_the_sidebar_once_and_never_fetches_it(operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator)
    add_turn_with_steps(session, steps=1)
    session.refresh_from_db()
    body = login(operator).get(f"/sessions/{session.id}/").content.decode()
    assert body.count('id="sidebar"') == 1
    assert f'<div id="sidebar" data-seq="{session.last_seq}">' in body
    assert "/sidebar/" not in body and "agentops:refresh" not in body
    assert 'name="csrfmiddlewaretoken"' in body[body.index('id="controls"'):]  # the page's forms work without JS


def test_fragments_push_the_sidebar_once_per_session_on_its_last_event_that_changes_it(
        operator: User, agent: AgentProfile, django_assert_num_queries: Any) -> None:
    first = factories.session(agent=agent, owner=operator)
    add_turn_with_steps(first, steps=3)
    second = factories.session(agent=agent, owner=operator)
    add_turn_with_steps(second, steps=1)
    events = [e.as_dict() for e in Event.objects.filter(session__in=[first, second]).order_by("session", "seq")]
    # steps (each saying whether it was ever asked about: none was, so no approvals query), turns,
    # the sessions of the sidebars: whatever the number of events
    with django_assert_num_queries(3):
        htmls = render_event_fragments(events)
    for session in (first, second):
        session.refresh_from_db()
        mine = [(event, html) for event, html in zip(events, htmls, strict=True)
                if event["session_id"] == str(session.id)]
        with_sidebar = [event for event, html in mine if 'data-target="#sidebar"' in html]
        changing = [event for event, _ in mine if SIDEBAR_TYPES.match(str(event["type"]))]
        assert with_sidebar == [changing[-1]]
        html = next(html for event, html in mine if event is changing[-1])
        op = html[html.index('data-target="#sidebar"'):]
        assert f'<div id="sidebar" data-seq="{session.last_seq}">' in op
        assert "Tool calls" in op and 'id="controls"' in op and "operate-only" in op
        assert "csrfmiddlewaretoken" not in op  # one copy for every viewer: htmx sends the token
        assert f'hx-post="/sessions/{session.id}/turns/"' in op
    delta = next(html for event, html in zip(events, htmls, strict=True) if event["type"] == "model.delta")
    assert "#sidebar" not in delta


def test_events_that_change_only_the_counters_push_the_usage_card_alone(
        operator: User, agent: AgentProfile, django_assert_num_queries: Any) -> None:
    """A running turn's steps (a reply, a tool's result) change the usage bars, not the controls:
    their batch carries the usage card (``#usage``), not the whole sidebar with its forms; a turn's
    end in the same batch brings the whole sidebar back."""
    session = factories.session(agent=agent, owner=operator)
    add_turn_with_steps(session, steps=2)
    session.refresh_from_db()
    events = [e.as_dict() for e in Event.objects.filter(session=session).order_by("seq")]
    steps_only = [e for e in events if e["type"] in ("model.completed", "tool.started", "tool.completed")]
    with django_assert_num_queries(2):  # steps and the session in one round trip, as two statements
        htmls = render_event_fragments(steps_only)
    assert not any('data-target="#sidebar"' in html for html in htmls)
    assert [i for i, html in enumerate(htmls) if 'data-target="#usage"' in html] == [len(steps_only) - 1]
    usage = htmls[-1][htmls[-1].index('data-target="#usage"'):]
    assert f'<section class="card" id="usage" data-seq="{session.last_seq}">' in usage
    assert "Tool calls" in usage and "operate-only" not in usage and "<form" not in usage
    with_end = render_event_fragments([*steps_only, next(e for e in events if e["type"] == "turn.completed")])
    assert 'data-target="#sidebar"' in with_end[-1] and not any("#usage" in html for html in with_end)
    page = login(operator).get(f"/sessions/{session.id}/").content.decode()
    assert page.count('id="usage"') == 1 and page.index('id="sidebar"') < page.index('id="usage"')


def test_sidebar_forms_posted_with_htmx_navigate_back_to_the_page(operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator)
    response = login(operator).post(f"/sessions/{session.id}/turns/", {"input": "next"},
                                    headers={"HX-Request": "true"})
    assert response.status_code == 200 and response["HX-Redirect"] == f"/sessions/{session.id}/"
    assert Turn.objects.get(session=session).input == "next"


def test_status_labels_come_from_the_models_choices(operator: User, agent: AgentProfile) -> None:
    labels: dict[str, set[str]] = {}
    for choices in (AgentSession.Status, Turn.Status, Step.Status, ApprovalRequest.Status):
        for value, label in choices.choices:
            labels.setdefault(value, set()).add(str(label))
    assert {value: names for value, names in labels.items() if len(names) > 1} == {}  # one label per value
    session = factories.session(agent=agent, owner=operator)
    services.turn_create(session_id=session.id, input="go")
    body = login(operator).get(f"/sessions/{session.id}/").content.decode()
    assert '<span id="session-status" class="badge s-in_progress">In progress</span>' in body
    assert '<span class="badge s-queued">Queued</span>' in body


@pytest.mark.django_db
def test_timeline_page_ignores_a_before_out_of_range() -> None:
    """On SQLite (make run) a before past 64 bits was an OverflowError, a 500; PostgreSQL compares
    it as numeric, so on PostgreSQL this passes with or without the guard."""
    owner = factories.user(groups=["operators"])
    session = factories.session(owner=owner)
    client = login(owner)
    for before in ["99999999999999999999999", "-5", "x"]:
        assert client.get(f"/sessions/{session.id}/timeline/?before={before}").status_code == 200, before


def test_a_steps_card_rides_on_its_last_event_of_a_batch(operator: User, agent: AgentProfile) -> None:
    """The engine commits a model reply, a tool call's start and end and the next model call
    together: the card shows the step as it is now, so it is rendered once, on the step's last
    event; an approval event (it also reaches the reviewers' queue) keeps its own."""
    session = factories.session(agent=agent, owner=operator)
    turn = add_turn_with_steps(session, steps=2)
    asked = Step.objects.filter(turn=turn, kind="tool").first()
    assert asked is not None
    services.event_record(session_id=session.id, turn_id=turn.id, step_id=asked.id, type="approval.decided",
                          payload={"request_id": "r1", "status": "approved"})
    services.event_record(session_id=session.id, turn_id=turn.id, step_id=asked.id, type="tool.completed")
    events = [e.as_dict() for e in Event.objects.filter(session=session).order_by("seq")]
    htmls = render_event_fragments(events)
    for step in Step.objects.filter(turn=turn):
        carrying = [e["type"] for e, html in zip(events, htmls, strict=True) if f'data-id="step-{step.id}"' in html]
        of_step = [e["type"] for e in events if e["step_id"] == str(step.id) and e["type"] != "model.delta"]
        expected = [of_step[-1]] if step != asked else ["approval.decided", "tool.completed"]
        assert carrying == expected, step.kind
    # Committed apart (each event a batch of its own), each event carries the card.
    for event in events:
        if event["type"] in ("tool.started", "model.started"):
            assert f'data-id="step-{event["step_id"]}"' in render_event_fragment(event)


def test_a_warmed_up_renderer_compiles_nothing_on_its_first_batch(
        operator: User, agent: AgentProfile, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fragments.warm_up`` (the announcer runs it at start): afterwards the first batch of a new
    session's events compiles no template and builds no SQL; without it, that batch did both."""
    from django.db.models.sql.compiler import SQLCompiler
    from django.template.base import Template

    from sessions_app import fragments

    add_turn_with_steps(factories.session(agent=agent, owner=operator), steps=1)  # what it warms up on
    fragments.warm_up()
    session = factories.session(agent=agent, owner=operator)
    add_turn_with_steps(session, steps=2)
    events = [e.as_dict() for e in Event.objects.filter(session=session).order_by("seq")]
    compiled: list[str] = []
    real_init, real_as_sql = Template.__init__, SQLCompiler.as_sql

    def template_init(self: Template, *args: Any, **kwargs: Any) -> None:
        compiled.append(f"template {kwargs.get('name') or args[1:2]}")
        real_init(self, *args, **kwargs)

    def as_sql(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
        compiled.append(f"sql {self.query.model.__name__ if self.query.model else '?'}")
        return real_as_sql(self, *args, **kwargs)

    monkeypatch.setattr(Template, "__init__", template_init)
    monkeypatch.setattr(SQLCompiler, "as_sql", as_sql)
    htmls = fragments.render_event_fragments(events)
    assert any('data-target="#sidebar"' in html for html in htmls) and any("exit 0" in html for html in htmls)
    if connection.vendor == "postgresql":  # elsewhere the batch reads are built by the ORM each time
        assert compiled == []
    else:
        assert not [c for c in compiled if c.startswith("template")]


def test_a_renderer_warmed_up_on_an_empty_database_fills_the_url_resolver_once(
        operator: User, agent: AgentProfile, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing stored yet to render (a new install): ``warm_up`` still fills the resolver, so the
    first batch's ``{% url %}`` tags do not (each read thread that rendered first used to)."""
    from django.urls import clear_url_caches
    from django.urls.resolvers import URLResolver

    from sessions_app import fragments

    assert not Event.objects.exists()
    clear_url_caches()  # a fresh process's resolver
    fragments.warm_up()
    filled: list[str] = []
    real_populate = URLResolver._populate

    def populate(self: URLResolver) -> None:
        filled.append(str(self.urlconf_name))
        real_populate(self)

    monkeypatch.setattr(URLResolver, "_populate", populate)
    session = factories.session(agent=agent, owner=operator)
    add_turn_with_steps(session, steps=2)
    htmls = fragments.render_event_fragments([e.as_dict() for e in Event.objects.filter(session=session)])
    assert any('data-target="#sidebar"' in html for html in htmls)
    assert filled == []


def test_a_web_process_warms_up_when_imported_by_its_server_not_inside_a_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``agentops.asgi`` warms the fragments up as daphne imports it (before its loop runs); imported
    by async code (a test's communicator) it leaves the ORM alone."""
    import asyncio

    from agentops import asgi
    from sessions_app import fragments

    calls: list[str] = []
    monkeypatch.setattr(fragments, "warm_up", lambda: calls.append("warm"))
    asgi._warm_up()
    assert calls == ["warm"]

    async def imported_in_a_loop() -> None:
        asgi._warm_up()

    asyncio.run(imported_in_a_loop())
    assert calls == ["warm"]


def test_pages_for_a_failed_login_a_team_without_agents_and_an_unknown_url(agent: AgentProfile) -> None:
    """From a browser audit: the username was cleared after a failed login; a team with no agent
    got a form with an empty Agent select that could only fail; a 404 was Django's bare page."""
    factories.user("lena", groups=["operators"])
    failed = Client().post("/login/", {"username": "lena", "password": "wrong"})
    assert 'name="username" value="lena"' in failed.content.decode()
    loner = factories.user("solo", groups=["operators"], teams=["empty-team"])
    client = login(loner)
    for path in ("/sessions/", "/batches/"):
        page = client.get(path).content.decode()
        assert 'id="no-agents"' in page and "Start session" not in page and "Start batch" not in page
    page = login(factories.user("dora", groups=["operators"])).get("/sessions/").content.decode()
    assert 'id="no-agents"' not in page and "Start session" in page
    missing = client.get(f"/sessions/{factories.session(agent=agent).id}/")  # another team's: as unknown
    assert missing.status_code == 404
    assert "Not found" in missing.content.decode() and 'class="topbar"' in missing.content.decode()
