"""Verification against the acceptance criteria: a verification step before a turn completes,
bounded re-work rounds, ``criteria_unmet`` with the verdicts in the timeline, the session list and
the API. Against the database, the model gateway and the scripted model over HTTP."""

import asyncio
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections

from approvals_app.models import ApprovalRequest
from scripted_model.server import ScriptedModelServer
from sessions_app.engine.commands import session_start
from sessions_app.engine.gateway import turn_drive_once
from sessions_app.engine.verification import VERIFICATION_MARKER
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from sessions_app.services import session_create, turn_create
from tests import factories
from tests.helpers import api_client, assert_gap_free, finished, login, tool

pytestmark = pytest.mark.django_db(transaction=True)

CRITERIA = ["The answer names the `alpha` release.", "The answer names the `beta` release."]


@pytest.fixture(autouse=True)
def _database_on_the_loop_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")


@pytest.fixture
def owner(transactional_db: None) -> User:
    return factories.user("vera", groups=["operators"])


def _run(turn_id: Any) -> None:
    async def go() -> None:
        try:
            await turn_drive_once(turn_id, db_in_loop=True)
        finally:
            connections.close_all()
    asyncio.run(go())


def _drive(agent: AgentProfile, owner: User, text: str, criteria: list[str] = CRITERIA) -> Turn:
    session = session_create(agent=agent, owner=owner, title="verify", pinned={"acceptance_criteria": criteria})
    turn = turn_create(session_id=session.id, input=text, actor=owner)
    _run(turn.id)
    return Turn.objects.get(pk=turn.pk)


def test_verification_met_completes_the_turn_with_its_verdicts(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer) -> None:
    after = scripted_model.request_log.last_seq
    turn = _drive(engine_agent, owner, "say shipped alpha and beta")
    assert turn.status == "completed" and turn.output_text == "shipped alpha and beta"
    assert turn.criteria_unmet is False
    assert turn.verdicts == [{"criterion": CRITERIA[0], "met": True, "evidence": "'alpha' appears in the result"},
                             {"criterion": CRITERIA[1], "met": True, "evidence": "'beta' appears in the result"}]
    sent = scripted_model.logged_requests(after=after)
    assert [e.purpose for e in sent] == ["chat", "verification"]
    assert VERIFICATION_MARKER in sent[1].system and CRITERIA[0] in sent[1].system  # pinned context verbatim
    (step,) = Step.objects.filter(turn=turn, kind="verification")
    assert step.status == "completed" and step.result is not None and step.result["all_met"] is True
    types = [t for t in Event.objects.filter(session_id=turn.session_id).order_by("seq").values_list("type", flat=True)
             if t in ("model.completed", "verification.started", "turn.verified", "turn.completed")]
    assert types == ["model.completed", "verification.started", "turn.verified", "turn.completed"]
    completed = Event.objects.get(session_id=turn.session_id, type="turn.completed")
    assert completed.payload["verdicts"] == turn.verdicts and completed.payload["criteria_unmet"] is False
    assert_gap_free(turn.session_id)


def test_verification_unmet_sends_the_agent_back_to_work(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer) -> None:
    after = scripted_model.request_log.last_seq
    turn = _drive(engine_agent, owner, "say only alpha\nsay alpha, then beta")
    assert turn.status == "completed" and turn.output_text == "alpha, then beta"
    assert turn.criteria_unmet is False
    sent = scripted_model.logged_requests(after=after)
    assert [e.purpose for e in sent] == ["chat", "verification", "chat", "verification"]
    rounds = list(Step.objects.filter(turn=turn, kind="verification").order_by("index"))
    assert [(s.arguments["round"], s.result["all_met"]) for s in rounds if s.result] == [(1, False), (2, True)]
    # The re-work call was told which criterion is unmet.
    session = AgentSession.objects.select_related("agent").get(pk=turn.session_id)
    from sessions_app.engine.prompt import build_messages
    told = [m["content"] for m in build_messages(session) if m["role"] == "system" and "Verification" in m["content"]]
    assert len(told) == 1 and CRITERIA[1] in told[0] and CRITERIA[0] not in told[0]


def test_verification_bounded_rounds_then_criteria_unmet_everywhere(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer) -> None:
    engine_agent.verification_rounds = 2
    engine_agent.save()
    turn = _drive(engine_agent, owner, "say alpha\nsay alpha again\nsay alpha once more\nsay beta too late")
    assert turn.status == "completed"
    assert turn.output_text == "alpha once more"  # three answers: the first and two re-work rounds
    assert turn.criteria_unmet is True
    assert turn.verdicts is not None and [v["met"] for v in turn.verdicts] == [True, False]
    assert Step.objects.filter(turn=turn, kind="verification", status="completed").count() == 3
    session = AgentSession.objects.get(pk=turn.session_id)
    assert session.criteria_unmet is True
    # The API.
    api = api_client(owner)
    assert api.get(f"/api/sessions/{session.id}").json()["criteria_unmet"] is True
    body = api.get(f"/api/turns/{turn.id}").json()
    assert body["criteria_unmet"] is True and body["verdicts"] == turn.verdicts
    assert [s["kind"] for s in body["steps"]].count("verification") == 3
    # The timeline and the session list.
    client = login(owner)
    page = client.get(f"/sessions/{session.id}/").content.decode()
    assert "criteria_unmet" in page and "✗ The answer names the `beta` release." in page
    assert "Verification" in page and "round 3" in page
    listing = client.get("/sessions/").content.decode()
    assert "criteria unmet" in listing


def test_verification_skipped_without_criteria(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer) -> None:
    after = scripted_model.request_log.last_seq
    turn = _drive(engine_agent, owner, "say plain", criteria=[])
    assert turn.status == "completed" and turn.verdicts is None and turn.criteria_unmet is False
    assert [e.purpose for e in scripted_model.logged_requests(after=after)] == ["chat"]


def test_verification_with_real_workers_after_tools(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer, workers: None) -> None:
    session, turn = session_start(agent=engine_agent, owner=owner, title="verify", input="\n".join([
        tool("list_files", path="."), "say found alpha", "say found alpha and beta"]),
        pinned={"acceptance_criteria": CRITERIA})
    assert turn is not None
    turn = finished(turn)
    assert turn.status == "completed" and turn.output_text == "found alpha and beta" and not turn.criteria_unmet
    assert Step.objects.filter(turn=turn, kind="verification", status="completed").count() == 2
    assert_gap_free(session.id)


# --- prohibitions: checked before a reviewer is asked -----------------------------------------

PROHIBITIONS = ["Never touch `prod.db`.", "Do not use `curl`."]


def test_prohibitions_checked_before_a_mutating_call_goes_to_the_reviewer(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer, reviewer: User) -> None:
    session = session_create(agent=engine_agent, owner=owner, title="prohibitions",
                             pinned={"prohibitions": PROHIBITIONS})
    after = scripted_model.request_log.last_seq
    turn = turn_create(session_id=session.id, actor=owner, input="\n".join([
        "parallel", tool("write_file", path="prod.db", content="x"), tool("write_file", path="notes.txt", content="y"),
        "end", "say done"]))
    _run(turn.id)
    sent = scripted_model.logged_requests(after=after)
    assert [e.purpose for e in sent] == ["chat", "prohibitions"]
    bad, good = Step.objects.filter(turn=turn, kind="tool").order_by("index")
    assert bad.status == good.status == "awaiting_approval"
    assert bad.checks == [
        {"prohibition": PROHIBITIONS[0], "violated": True, "evidence": "'prod.db' appears in the call"},
        {"prohibition": PROHIBITIONS[1], "violated": False, "evidence": "'curl' does not appear in the call"}]
    assert good.checks is not None and not any(c["violated"] for c in good.checks)
    bad_request = ApprovalRequest.objects.get(step=bad)
    good_request = ApprovalRequest.objects.get(step=good)
    assert bad_request.risk == "high" and PROHIBITIONS[0] in bad_request.risk_note
    assert PROHIBITIONS[0] not in good_request.risk_note
    page = login(reviewer).get(f"/approvals/{bad_request.request_id}/").content.decode()
    assert 'id="prohibition-checks"' in page and "✗ may violate: Never touch `prod.db`." in page
    assert "✓ respects: Do not use `curl`." in page
    # The check's tokens are counted in the session's usage.
    session.refresh_from_db()
    model_step = Step.objects.get(turn=turn, kind="model")
    assert session.prompt_tokens == model_step.prompt_tokens + sent[1].prompt_tokens


def test_prohibitions_not_checked_for_read_only_calls(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer) -> None:
    session = session_create(agent=engine_agent, owner=owner, title="read only",
                             pinned={"prohibitions": PROHIBITIONS})
    after = scripted_model.request_log.last_seq
    turn = turn_create(session_id=session.id, actor=owner, input=tool("list_files", path=".") + "\nsay ok")
    _run(turn.id)
    assert Turn.objects.get(pk=turn.pk).status == "completed"
    assert [e.purpose for e in scripted_model.logged_requests(after=after)] == ["chat", "chat"]


def test_verification_step_recovered_after_a_crash_and_recorded_once(
        engine_agent: AgentProfile, owner: User, scripted_model: ScriptedModelServer) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from sessions_app.engine import llm
    from sessions_app.engine.recovery import step_recover
    from sessions_app.engine.tick import turn_tick
    from sessions_app.engine.verification import verification_record_atomic

    session = session_create(agent=engine_agent, owner=owner, title="crash", pinned={"acceptance_criteria": CRITERIA})
    turn = turn_create(session_id=session.id, input="say alpha and beta", actor=owner)
    # The answer is recorded; the tick claims the verification and that worker dies.
    from sessions_app.engine.model_step import model_reply_record
    model = turn_tick(turn.id, calls_models=True)
    assert model is not None and model.step.kind == "model"
    model_reply_record(step=model.step, reply=llm.ModelReply(content="alpha and beta"),
                       message={"role": "assistant", "content": "alpha and beta"})
    claimed = turn_tick(turn.id, calls_models=True)
    assert claimed is not None and claimed.step.kind == "verification"
    dead = claimed.step
    Step.objects.filter(pk=dead.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert step_recover(dead.pk) is True
    assert Step.objects.get(pk=dead.pk).status == "planned"
    _run(turn.id)  # a fresh gateway re-runs it
    turn = Turn.objects.get(pk=turn.pk)
    assert turn.status == "completed" and turn.output_text == "alpha and beta" and turn.criteria_unmet is False
    rerun = Step.objects.get(pk=dead.pk)
    assert rerun.status == "completed" and rerun.attempts == 2
    # The dead worker's late verdict changes nothing.
    late = llm.ModelReply(content='{"verdicts": []}')
    assert verification_record_atomic(dead, late) is False
    assert Step.objects.get(pk=dead.pk).result == rerun.result
    assert Event.objects.filter(step_id=dead.pk, type="turn.verified").count() == 1
