"""A running command's output reaches the timeline while it runs: ``tool.progress`` events
(batched, rate-limited), the session page and the reviewer's page show the text so far and a
progress bar, and the live fragments append to them. A real worker runs the command under
bubblewrap."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from approvals_app.services import approval_decide
from sessions_app.engine.commands import session_start
from sessions_app.fragments import render_event_fragment
from sessions_app.models import AgentProfile, Event, Step
from sessions_app.services import event_record, step_transition, turn_transition
from tests import factories
from tests.helpers import finished, login, pending_approvals, script, tool
from tests.waiting import wait_for
from tools_app.sandbox.workspace import workspace_for

# After part 6 it waits (up to 30 s, then it fails) for the test to create ``go`` in the workspace:
# the pages are read while it surely runs (a 3-s command had finished before a loaded machine
# rendered them).
COMMAND = ('for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo "built part $i"; '
           'echo "@@progress {\\"done\\": $i, \\"total\\": 12, \\"note\\": \\"parts\\"}"; sleep 0.25; '
           'if [ $i = 6 ]; then n=0; while [ ! -e go ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done; '
           '[ -e go ] || exit 7; fi; done')


@pytest.mark.usefixtures("workers")
def test_running_command_streams_tool_progress_shown_live(engine_agent: AgentProfile, operator: User,
                                                          reviewer: User) -> None:
    session, turn = session_start(agent=engine_agent, owner=operator,
                                  input=script(tool("run_command", command=COMMAND), "say done: {results}"))
    assert turn is not None
    (approval,) = pending_approvals(turn)
    approval_decide(request_id=approval.request_id, actor=reviewer, decision="approve",
                    seen_hash=approval.arguments_sha256)
    step_id = approval.step_id
    # While it runs: the session page and the reviewer's page show its output so far and a bar.
    wait_for(lambda: Event.objects.filter(step_id=step_id, type="tool.progress", payload__has_key="progress")
             .exists(), 30, "the first progress event")
    for page in (login(operator).get(f"/sessions/{session.id}/"),
                 login(reviewer).get(f"/approvals/{approval.request_id}/")):
        body = page.content.decode()
        assert Step.objects.get(pk=step_id).status == "running"
        assert f'id="step-{step_id}-live"' in body and "built part 1" in body
        assert f'id="step-{step_id}-progress"' in body and '<progress class="bar" max="100" value=' in body
    (workspace_for(session.id) / "go").touch()
    turn = finished(turn, timeout=60)
    assert turn.status == "completed", (turn.error_code, turn.error_message)

    events = list(Event.objects.filter(step_id=step_id).order_by("seq"))
    progress = [e for e in events if e.type == "tool.progress"]
    completed = next(e for e in events if e.type == "tool.completed")
    assert all(e.seq < completed.seq for e in progress)
    step = Step.objects.get(pk=step_id)
    assert step.result is not None
    seconds = step.result["duration_ms"] / 1000
    # Batched: at most one per interval (0.5 s) and the last one, however many lines it printed.
    assert 2 <= len(progress) <= seconds / 0.5 + 2, (len(progress), seconds)
    streamed = "".join(e.payload.get("stdout", "") for e in progress)
    assert streamed == "".join(f"built part {i}\n" for i in range(1, 13))
    assert progress[-1].payload["progress"] == {"done": 12, "total": 12, "percent": 100, "note": "parts"}
    assert "@@progress" in step.result["output"] and "built part 12" in step.result["output"]


@pytest.mark.django_db
def test_tool_progress_fragment_appends_text_and_replaces_the_bar(operator: User) -> None:
    session = factories.session(owner=operator)
    turn = factories.turn(session)
    step = factories.step(turn, tool_name="run_command")
    event = event_record(session_id=session.id, turn_id=turn.id, step_id=step.id, type="tool.progress",
                         payload={"stdout": "<b>hi</b>\n", "progress": {"done": 3, "total": 4, "percent": 75}})
    html = render_event_fragment(event.as_dict())
    assert f'data-op="append-text" data-target="#step-{step.id}-live"' in html
    assert "&lt;b&gt;hi&lt;/b&gt;" in html and "<b>hi" not in html
    assert f'data-op="replace" data-target="#step-{step.id}-progress"' in html
    assert 'value="75"' in html and "3 / 4" in html
    assert f'data-target="#turn-{turn.id}-items"' not in html  # the card is not re-rendered per batch


@pytest.mark.django_db
def test_session_page_shows_a_running_commands_output_so_far(operator: User) -> None:
    session = factories.session(owner=operator)
    turn = factories.turn(session)
    turn_transition(turn_id=turn.id, to="running")
    step = factories.step(turn, tool_name="run_command", arguments={"command": "make"})
    step_transition(step_id=step.id, to="approved")
    step_transition(step_id=step.id, to="running", lease_expires_at=timezone.now() + timedelta(minutes=5))
    for n in (1, 2):
        event_record(session_id=session.id, turn_id=turn.id, step_id=step.id, type="tool.progress",
                     payload={"stdout": f"line {n}\n", "progress": {"done": n, "total": 8, "percent": 25 * n // 2}})
    body = login(operator).get(f"/sessions/{session.id}/").content.decode()
    assert "line 1\nline 2\n" in body
    assert 'value="25"' in body and "2 / 8" in body
