"""The sessions JSON API: sessions, turns, events (list and SSE), tool outputs, artifacts, agents, tools."""

import asyncio
import hashlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.test import AsyncClient, Client

from sessions_app.models import AgentProfile, AgentSession, Artifact, Event, Step, Turn
from sessions_app.services import artifact_record, event_record, step_transition
from tests import factories
from tests.helpers import api_client, api_token, login
from tools_app.models import ToolDefinition
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db

NumQueries = Callable[..., Any]


@pytest.fixture
def api(operator: User) -> Client:
    return api_client(operator)


def _start(api: Client, agent: AgentProfile, **body: Any) -> dict[str, Any]:
    response = api.post("/api/sessions", {"agent": agent.slug, **body}, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()


def _event_types(session_id: Any) -> list[str]:
    return list(Event.objects.filter(session_id=session_id).order_by("seq").values_list("type", flat=True))


# --- sessions ----------------------------------------------------------------------------------------------------

def test_session_start_api_creates_session_and_first_turn(api: Client, operator: User, agent: AgentProfile) -> None:
    body = _start(api, agent, input="Summarise the repo", title="Repo summary",
                  pinned={"requirements": ["be brief"], "acceptance_criteria": ["a summary"]},
                  budget={"max_tool_calls": 5}, metadata={"ticket": "OPS-1"})

    session = AgentSession.objects.get(pk=body["id"])
    turn = Turn.objects.get(session=session)
    assert body["agent"] == agent.slug and body["owner"] == "op" and body["title"] == "Repo summary"
    assert body["status"] == session.status == "in_progress"
    assert body["pinned"] == {"requirements": ["be brief"], "prohibitions": [], "acceptance_criteria": ["a summary"]}
    assert body["budget"]["max_tool_calls"] == session.max_tool_calls == 5
    assert body["metadata"] == session.metadata == {"ticket": "OPS-1"}
    assert body["turn"]["id"] == str(turn.id) and body["turn"]["status"] == turn.status == "queued"
    assert body["turn"]["input"] == turn.input == "Summarise the repo"
    assert session.owner == operator and turn.created_by == operator
    assert body["last_seq"] == session.last_seq
    assert _event_types(session.id)[0] == "session.created" and "turn.queued" in _event_types(session.id)


def test_session_start_api_without_input_creates_an_idle_session(api: Client, agent: AgentProfile) -> None:
    body = _start(api, agent)
    assert body["turn"] is None and body["status"] == "idle" and body["title"] == ""
    assert AgentSession.objects.get(pk=body["id"]).status == "idle"
    assert Turn.objects.count() == 0


def test_session_start_api_unknown_agent_is_404(api: Client) -> None:
    response = api.post("/api/sessions", {"agent": "ghost", "input": "hi"}, content_type="application/json")
    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "message": "No agent 'ghost'", "details": {"field": "agent"}}
    assert AgentSession.objects.count() == 0


@pytest.mark.parametrize("body", [
    {"input": "no agent"},
    {"agent": 7},
    {"agent": "AGENT", "budget": {"max_tool_calls": -1}},
    {"agent": "AGENT", "budget": {"max_tool_calls": "many"}},
    {"agent": "AGENT", "budget": {"coffee": 1}},
    {"agent": "AGENT", "pinned": {"mood": ["x"]}},
    {"agent": "AGENT", "pinned": ["not", "an", "object"]},
    {"agent": "AGENT", "title": "t" * 201},
    {"agent": "AGENT", "metadata": "nope"},
])
def test_session_start_api_wrong_types_are_422(api: Client, agent: AgentProfile, body: dict[str, Any]) -> None:
    if body.get("agent") == "AGENT":
        body = {**body, "agent": agent.slug}
    response = api.post("/api/sessions", body, content_type="application/json")
    assert response.status_code == 422, response.content
    assert response.json()["code"] == "invalid_arguments"
    assert set(response.json()) == {"code", "message", "details"}
    assert AgentSession.objects.count() == 0


def test_session_start_api_disabled_agent_is_refused(api: Client) -> None:
    disabled = factories.agent_profile(enabled=False)
    response = api.post("/api/sessions", {"agent": disabled.slug}, content_type="application/json")
    assert response.status_code == 422
    assert response.json()["details"] == {"field": "agent"}
    assert AgentSession.objects.count() == 0


def test_session_get_api_returns_the_session(api: Client, operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator, title="one")
    response = api.get(f"/api/sessions/{session.id}")
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == str(session.id) and body["title"] == "one" and body["status"] == "idle"
    assert body["usage"] == {"tool_calls": 0, "model_calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                             "wall_seconds": 0.0}


@pytest.mark.parametrize("session_id", [pytest.param(str(uuid.uuid4()), id="unknown-uuid"), "garbage", "1",
                                        "00000000-0000-0000-0000-00000000000g"])
def test_session_get_api_unknown_or_garbage_id_is_404(api: Client, session_id: str) -> None:
    for path in (f"/api/sessions/{session_id}", f"/api/sessions/{session_id}/turns",
                 f"/api/sessions/{session_id}/events", f"/api/sessions/{session_id}/artifacts",
                 f"/api/sessions/{session_id}/events/stream?max_seconds=0.1"):
        response = api.get(path)
        assert response.status_code == 404, path
        assert response.json()["code"] == "not_found"
    for path, body in ((f"/api/sessions/{session_id}/cancel", {}),
                       (f"/api/sessions/{session_id}/turns", {"input": "x"}),
                       (f"/api/sessions/{session_id}/tool-outputs", {"call_id": "c", "output": "x"})):
        response = api.post(path, body, content_type="application/json")
        assert response.status_code == 404, path
        assert response.json()["code"] == "not_found"
    assert Turn.objects.count() == 0


def test_sessions_list_api_filters_by_status_agent_and_text(api: Client, operator: User, agent: AgentProfile,
                                                            django_assert_num_queries: NumQueries) -> None:
    other_agent = factories.agent_profile()
    idle = factories.session(agent=agent, owner=operator, title="Quarterly report")
    busy = factories.session(agent=agent, owner=operator, title="Deploy")
    factories.turn(busy, input="roll out the canary")
    elsewhere = factories.session(agent=other_agent, owner=operator, title="Elsewhere report")

    def ids(query: str) -> list[str]:
        response = api.get(f"/api/sessions{query}")
        assert response.status_code == 200, response.content
        return [item["id"] for item in response.json()["items"]]

    assert ids("") == [str(elsewhere.id), str(busy.id), str(idle.id)]
    assert ids("?status=in_progress") == [str(busy.id)]
    assert ids("?status=idle") == [str(elsewhere.id), str(idle.id)]
    assert ids(f"?agent={agent.slug}") == [str(busy.id), str(idle.id)]
    assert ids("?q=REPORT") == [str(elsewhere.id), str(idle.id)]
    assert ids("?q=canary") == [str(busy.id)]  # matches a turn's input
    assert ids(f"?q=report&agent={agent.slug}&status=idle") == [str(idle.id)]
    assert ids("?agent=ghost") == []

    for _ in range(5):
        factories.session(agent=agent, owner=operator)
    # token lookup (its last_used_at was written a moment ago), one permission read, one page: no query per row
    with django_assert_num_queries(3):
        response = api.get("/api/sessions")
    assert len(response.json()["items"]) == 8


def test_sessions_list_api_cursor_walks_every_session_once(api: Client, operator: User, agent: AgentProfile,
                                                          django_assert_num_queries: NumQueries) -> None:
    sessions = [factories.session(agent=agent, owner=operator, title=f"s{i}") for i in range(11)]
    # Ties on created_at must not lose or repeat rows at a page boundary.
    tied = sessions[3].created_at
    AgentSession.objects.filter(pk__in=[s.pk for s in sessions[2:7]]).update(created_at=tied)
    expected = [str(s.id) for s in AgentSession.objects.order_by("-created_at", "-id")]

    seen: list[str] = []
    cursor = ""
    pages = 0
    while True:
        with django_assert_num_queries(3):
            response = api.get(f"/api/sessions?limit=3{'&cursor=' + cursor if cursor else ''}")
        assert response.status_code == 200
        page = response.json()
        pages += 1
        assert len(page["items"]) <= 3
        seen += [item["id"] for item in page["items"]]
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert pages == 4
    assert seen == expected  # newest first, nothing missing, nothing twice
    assert len(set(seen)) == 11


def test_sessions_list_api_invalid_cursor_is_400_and_invalid_status_or_limit_422(api: Client) -> None:
    response = api.get("/api/sessions?cursor=not-a-cursor")
    assert response.status_code == 400
    assert response.json() == {"code": "invalid_arguments", "message": "Invalid cursor",
                               "details": {"field": "cursor"}}
    assert api.get("/api/sessions?limit=many").status_code == 422
    unknown_status = api.get("/api/sessions?status=sleeping")
    assert unknown_status.status_code == 422
    assert unknown_status.json()["details"]["allowed"] == [s.value for s in AgentSession.Status]


def test_session_cancel_api_cancels_the_active_turn(api: Client, agent: AgentProfile) -> None:
    started = _start(api, agent, input="long job")
    response = api.post(f"/api/sessions/{started['id']}/cancel")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "idle"
    turn = Turn.objects.get(pk=started["turn"]["id"])
    assert turn.status == "cancelled" and turn.error_code == "cancelled" and turn.finished_at is not None
    assert _event_types(started["id"]).count("turn.cancelled") == 1

    again = api.post(f"/api/sessions/{started['id']}/cancel")  # nothing active: a no-op
    assert again.status_code == 200 and again.json()["status"] == "idle"
    assert _event_types(started["id"]).count("turn.cancelled") == 1


# --- turns -------------------------------------------------------------------------------------------------------

def test_turn_submit_api_queues_a_turn_and_refuses_a_second_while_one_is_active(api: Client,
                                                                               agent: AgentProfile) -> None:
    session_id = _start(api, agent)["id"]
    response = api.post(f"/api/sessions/{session_id}/turns", {"input": "first"}, content_type="application/json")
    assert response.status_code == 201, response.content
    body = response.json()
    turn = Turn.objects.get(pk=body["id"])
    assert body["session_id"] == session_id and body["index"] == 1 and body["status"] == turn.status == "queued"

    busy = api.post(f"/api/sessions/{session_id}/turns", {"input": "second"}, content_type="application/json")
    assert busy.status_code == 409
    assert busy.json()["code"] == "turn_active"
    assert Turn.objects.filter(session_id=session_id).count() == 1

    api.post(f"/api/sessions/{session_id}/cancel")
    after = api.post(f"/api/sessions/{session_id}/turns", {"input": "third"}, content_type="application/json")
    assert after.status_code == 201 and after.json()["index"] == 2


@pytest.mark.parametrize("body", [{}, {"input": ""}, {"input": 5}, {"input": None}, {"input": "   "}])
def test_turn_submit_api_bad_input_is_422(api: Client, operator: User, body: dict[str, Any]) -> None:
    session = factories.session(owner=operator)
    response = api.post(f"/api/sessions/{session.id}/turns", body, content_type="application/json")
    assert response.status_code == 422, response.content
    assert response.json()["code"] == "invalid_arguments"
    assert Turn.objects.count() == 0


def test_turns_list_api_in_order(api: Client, operator: User, django_assert_num_queries: NumQueries) -> None:
    session = factories.session(owner=operator)
    first = factories.turn(session, input="one")
    api.post(f"/api/sessions/{session.id}/cancel")
    second = factories.turn(session, input="two")
    with django_assert_num_queries(4):  # auth, permissions (1), session, turns
        response = api.get(f"/api/sessions/{session.id}/turns")
    assert response.status_code == 200
    assert [(t["id"], t["index"], t["status"]) for t in response.json()] == [
        (str(first.id), 1, "cancelled"), (str(second.id), 2, "queued")]


def test_turn_get_api_includes_steps(api: Client, operator: User) -> None:
    turn = factories.turn(factories.session(owner=operator), input="list files")
    model = factories.step(turn, kind="model", tool_name="")
    tool = factories.step(turn, tool_name="list_files", call_id="call_1", arguments={"path": "."},
                          approval_mode="safe_readonly")
    response = api.get(f"/api/turns/{turn.id}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"] == str(turn.id) and body["input"] == "list files" and body["status"] == "queued"
    assert [(s["id"], s["kind"], s["index"]) for s in body["steps"]] == [(str(model.id), "model", 0),
                                                                        (str(tool.id), "tool", 1)]
    assert body["steps"][1]["arguments"] == {"path": "."} and body["steps"][1]["call_id"] == "call_1"
    assert api.get(f"/api/turns/{uuid.uuid4()}").status_code == 404
    assert api.get("/api/turns/garbage").json()["code"] == "not_found"


# --- events ------------------------------------------------------------------------------------------------------

def _session_with_events(owner: User, count: int) -> AgentSession:
    session = factories.session(owner=owner)  # records session.created (seq 1)
    for n in range(count - 1):
        event_record(session_id=session.id, type="custom.tick", payload={"n": n})
    session.refresh_from_db()
    assert session.last_seq == count
    return session


def test_events_list_api_pages_by_seq(api: Client, operator: User, django_assert_num_queries: NumQueries) -> None:
    session = _session_with_events(operator, 7)
    with django_assert_num_queries(4):  # auth, permissions (1), session, events
        response = api.get(f"/api/sessions/{session.id}/events?after=0&limit=3")
    page = response.json()
    assert response.status_code == 200
    assert [e["seq"] for e in page["items"]] == [1, 2, 3] and page["next_after"] == 3
    first = page["items"][0]
    assert set(first) == {"seq", "type", "turn_id", "step_id", "payload", "created_at"}
    assert first["type"] == "session.created" and first["turn_id"] is None and first["payload"]["owner"] == "op"

    seqs = [e["seq"] for e in page["items"]]
    after = page["next_after"]
    while True:
        page = api.get(f"/api/sessions/{session.id}/events?after={after}&limit=3").json()
        if not page["items"]:
            assert page["next_after"] == after  # caught up: poll again with the same `after`
            break
        seqs += [e["seq"] for e in page["items"]]
        after = page["next_after"]
    assert seqs == list(range(1, 8))
    assert api.get(f"/api/sessions/{session.id}/events?after=x").status_code == 422


def _frames(raw: str) -> list[str]:
    return [frame for frame in raw.split("\n\n") if frame]


def _ids(raw: str) -> list[int]:
    return [int(line[4:]) for frame in _frames(raw) for line in frame.splitlines() if line.startswith("id: ")]


def _stream(token: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Read a whole SSE response (the stream closes itself with ``max_seconds``)."""

    async def read() -> tuple[int, str, str]:
        # Headers per request: AsyncClient(headers=...) mangles them into "Http-Authorization" (Django 5.2.19).
        response = await AsyncClient().get(path, headers={"Authorization": f"Bearer {token}", **(headers or {})})
        if not response.streaming:
            return response.status_code, response["Content-Type"], response.content.decode()
        body = b"".join([chunk async for chunk in response.streaming_content])  # type: ignore[attr-defined]
        return response.status_code, response["Content-Type"], body.decode()

    # async_to_sync from the test's thread: the view's database reads run on this thread, in the test transaction.
    return async_to_sync(read)()


@pytest.mark.django_db(transaction=True)  # the stream reads in worker threads: rows must be committed
def test_events_stream_api_sends_the_backlog_with_seq_ids(operator: User) -> None:
    session = _session_with_events(operator, 5)
    status, content_type, raw = _stream(api_token(operator),
                                        f"/api/sessions/{session.id}/events/stream?max_seconds=0.3")
    assert status == 200 and content_type == "text/event-stream"
    assert _ids(raw) == [1, 2, 3, 4, 5]
    assert raw.startswith(": connected\n\n")
    frame = next(f for f in _frames(raw) if f.startswith("id: 2\n"))
    assert "event: custom.tick\n" in frame and '"seq": 2' in frame


@pytest.mark.django_db(transaction=True)  # the stream reads in worker threads: rows must be committed
def test_events_stream_api_resumes_from_last_event_id_or_after(operator: User) -> None:
    session = _session_with_events(operator, 6)
    token = api_token(operator)
    path = f"/api/sessions/{session.id}/events/stream?max_seconds=0.3"
    assert _ids(_stream(token, path, {"Last-Event-ID": "4"})[2]) == [5, 6]
    assert _ids(_stream(token, path + "&after=2")[2]) == [3, 4, 5, 6]
    assert _ids(_stream(token, path + "&after=1", {"Last-Event-ID": "5"})[2]) == [2, 3, 4, 5, 6]  # ?after= wins
    assert _ids(_stream(token, path, {"Last-Event-ID": "6"})[2]) == []


@pytest.mark.django_db(transaction=True)  # the stream reads in worker threads: rows must be committed
def test_events_stream_api_sends_heartbeat_comments(operator: User, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sessions_app.streams.HEARTBEAT_SECONDS", 0.05)
    session = factories.session(owner=operator)
    raw = _stream(api_token(operator), f"/api/sessions/{session.id}/events/stream?max_seconds=0.4")[2]
    assert raw.count(": heartbeat\n\n") >= 3
    assert _ids(raw) == [1]


def test_events_stream_api_needs_auth_and_permission(operator: User) -> None:
    session = factories.session(owner=operator)
    nobody = factories.user("nobody")
    path = f"/api/sessions/{session.id}/events/stream?max_seconds=0.1"
    assert _stream("aop_wrong", path)[0] == 401
    status, _, raw = _stream(api_token(nobody), path)
    assert status == 403 and '"permission_denied"' in raw


@pytest.mark.django_db(transaction=True)
def test_events_stream_api_delivers_a_live_event_after_the_backlog() -> None:
    operator = factories.user("live-op", groups=["operators"])
    session = _session_with_events(operator, 2)
    token = api_token(operator)

    async def read() -> str:
        response = await AsyncClient().get(f"/api/sessions/{session.id}/events/stream?max_seconds=1.5",
                                           headers={"Authorization": f"Bearer {token}"})
        chunks = response.streaming_content.__aiter__()  # type: ignore[attr-defined]
        raw = ""
        while "id: 2\n" not in raw:  # the backlog is out: the stream is subscribed and waiting
            raw += (await asyncio.wait_for(chunks.__anext__(), 5)).decode()
        await sync_to_async(event_record)(session_id=session.id, type="custom.live", payload={"live": True})
        async for chunk in chunks:
            raw += chunk.decode()
        return raw

    raw = async_to_sync(read)()
    assert _ids(raw) == [1, 2, 3]
    live = next(f for f in _frames(raw) if f.startswith("id: 3\n"))
    assert "event: custom.live\n" in live and '"live": true' in live


# --- client tool outputs -----------------------------------------------------------------------------------------

def _waiting_client_call(owner: User, call_id: str = "call_42") -> Step:
    turn = factories.turn(factories.session(owner=owner), input="ask the client")
    step = factories.step(turn, tool_name="lookup_customer", call_id=call_id, arguments={"id": 7})
    return step_transition(step_id=step.id, to=Step.Status.RUNNING)  # a client tool: running, no lease


def test_tool_output_submit_api_completes_the_waiting_call(api: Client, operator: User) -> None:
    step = _waiting_client_call(operator)
    response = api.post(f"/api/sessions/{step.session_id}/tool-outputs",
                        {"call_id": "call_42", "output": {"name": "Ada"}, "success": True},
                        content_type="application/json")
    assert response.status_code == 200, response.content
    body = response.json()
    step.refresh_from_db()
    assert body["id"] == str(step.id) and body["status"] == step.status == "completed"
    assert step.result == {"status": "completed", "output": '{"name": "Ada"}', "error_code": ""}
    assert _event_types(step.session_id)[-1] == "tool.output_submitted"

    replay = api.post(f"/api/sessions/{step.session_id}/tool-outputs",
                      {"call_id": "call_42", "output": {"name": "Ada"}}, content_type="application/json")
    assert replay.status_code == 200  # the same output again changes nothing
    other = api.post(f"/api/sessions/{step.session_id}/tool-outputs",
                     {"call_id": "call_42", "output": "different"}, content_type="application/json")
    assert other.status_code == 409 and other.json()["code"] == "already_submitted"
    assert _event_types(step.session_id).count("tool.output_submitted") == 1


def test_tool_output_submit_api_failure_marks_the_step_failed(api: Client, operator: User) -> None:
    step = _waiting_client_call(operator)
    response = api.post(f"/api/sessions/{step.session_id}/tool-outputs",
                        {"call_id": "call_42", "output": "lookup service down", "success": False},
                        content_type="application/json")
    assert response.status_code == 200
    step.refresh_from_db()
    assert step.status == "failed" and step.error_code == "client_error"


def test_tool_output_submit_api_unknown_call_id_is_404(api: Client, operator: User) -> None:
    step = _waiting_client_call(operator)
    other_session_step = _waiting_client_call(operator, call_id="call_other")
    for call_id in ("call_nope", "call_other"):  # a call of another session is unknown here
        response = api.post(f"/api/sessions/{step.session_id}/tool-outputs", {"call_id": call_id, "output": "x"},
                            content_type="application/json")
        assert response.status_code == 404
        assert response.json() == {"code": "not_found", "message": f"No tool call {call_id!r} in this session",
                                   "details": {"call_id": call_id}}
    step.refresh_from_db()
    other_session_step.refresh_from_db()
    assert step.status == other_session_step.status == "running"


@pytest.mark.parametrize("body", [{"output": "x"}, {"call_id": "", "output": "x"}, {"call_id": "call_42", "output": "x",
                                                                                   "success": "perhaps"}])
def test_tool_output_submit_api_bad_input_is_422(api: Client, operator: User, body: dict[str, Any]) -> None:
    step = _waiting_client_call(operator)
    response = api.post(f"/api/sessions/{step.session_id}/tool-outputs", body, content_type="application/json")
    assert response.status_code == 422
    step.refresh_from_db()
    assert step.status == "running"


# --- artifacts ---------------------------------------------------------------------------------------------------

def _artifact(session: AgentSession, name: str, data: bytes) -> Artifact:
    stored = Path(settings.AGENTOPS_ARTIFACT_ROOT) / uuid.uuid4().hex
    stored.write_bytes(data)
    return artifact_record(session_id=session.id, path=f"out/{name}", size=len(data),
                           sha256=hashlib.sha256(data).hexdigest(), storage_path=str(stored),
                           content_type="text/plain")


def test_artifacts_list_api_and_content_download(api: Client, operator: User,
                                                 django_assert_num_queries: NumQueries) -> None:
    session = factories.session(owner=operator)
    first = _artifact(session, "report.txt", b"all green\n")
    second = _artifact(session, "notes.txt", b"n")
    _artifact(factories.session(owner=operator), "elsewhere.txt", b"e")

    with django_assert_num_queries(4):  # auth, permissions (1), session, artifacts
        response = api.get(f"/api/sessions/{session.id}/artifacts")
    assert response.status_code == 200
    items = response.json()
    assert [a["id"] for a in items] == [str(first.id), str(second.id)]
    assert items[0]["path"] == "out/report.txt" and items[0]["size"] == 10
    assert items[0]["sha256"] == hashlib.sha256(b"all green\n").hexdigest()

    download = api.get(f"/api/artifacts/{first.id}/content")
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == b"all green\n"  # type: ignore[attr-defined]
    assert download["Content-Type"] == "text/plain"
    assert download["Content-Disposition"] == 'attachment; filename="report.txt"'
    assert download["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize(("name", "stored_type", "served_type"), [
    ("page.html", "text/html", "application/octet-stream"),
    ("logo.svg", "image/svg+xml", "application/octet-stream"),
    ("plot.png", "image/png", "image/png"),
    ("data.json", "application/json; charset=utf-8", "application/json"),
])
def test_artifact_content_api_and_page_serve_one_policy(api: Client, operator: User, name: str, stored_type: str,
                                                        served_type: str) -> None:
    session = factories.session(owner=operator)
    stored = Path(settings.AGENTOPS_ARTIFACT_ROOT) / uuid.uuid4().hex
    stored.write_bytes(b"<svg onload=alert(1)>")
    artifact = artifact_record(session_id=session.id, path=f"out/{name}", size=21, sha256="ab" * 32,
                               storage_path=str(stored), content_type=stored_type)
    page = login(operator).get(f"/sessions/{session.id}/artifacts/{artifact.id}/")
    for response in (api.get(f"/api/artifacts/{artifact.id}/content"), page):
        assert response.status_code == 200
        assert response["Content-Type"] == served_type
        assert response["Content-Disposition"] == f'attachment; filename="{name}"'
        assert response["X-Content-Type-Options"] == "nosniff"


def test_artifact_content_api_and_page_refuse_a_file_outside_the_artifact_root(api: Client, operator: User,
                                                                               tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not an artifact")
    session = factories.session(owner=operator)
    for storage_path in (str(secret), "../" * 20 + str(secret).lstrip("/")):
        artifact = artifact_record(session_id=session.id, path=f"out/{uuid.uuid4().hex}.txt", size=15,
                                   sha256=uuid.uuid4().hex * 2, storage_path=storage_path)
        response = api.get(f"/api/artifacts/{artifact.id}/content")
        assert response.status_code == 404 and response.json()["code"] == "not_found"
        assert login(operator).get(f"/sessions/{session.id}/artifacts/{artifact.id}/").status_code == 404


def test_artifact_content_api_missing_is_404(api: Client, operator: User) -> None:
    artifact = _artifact(factories.session(owner=operator), "gone.txt", b"x")
    Path(artifact.storage_path).unlink()
    response = api.get(f"/api/artifacts/{artifact.id}/content")
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    for artifact_id in (uuid.uuid4(), "garbage"):
        assert api.get(f"/api/artifacts/{artifact_id}/content").status_code == 404


# --- agents and tools --------------------------------------------------------------------------------------------

def test_agents_list_api_lists_enabled_agents(api: Client, django_assert_num_queries: NumQueries) -> None:
    tool_definitions_seed()
    helper = factories.agent_profile(name="Helper", slug="helper", model="gpt-x", max_tool_calls=9)
    helper.tools.set(ToolDefinition.objects.filter(name__in=["read_file", "list_files"]))
    factories.agent_profile(slug="retired", enabled=False)
    factories.agent_profile(slug="other")
    with django_assert_num_queries(4):  # auth, permissions (1), agents, their tools
        response = api.get("/api/agents")
    assert response.status_code == 200
    by_slug = {a["slug"]: a for a in response.json()}
    assert set(by_slug) == {"helper", "other"}
    assert by_slug["helper"]["name"] == "Helper" and by_slug["helper"]["model"] == "gpt-x"
    assert sorted(by_slug["helper"]["tools"]) == ["list_files", "read_file"]
    assert by_slug["helper"]["budget"]["max_tool_calls"] == 9


def test_tools_list_api_lists_enabled_tools(api: Client, django_assert_num_queries: NumQueries) -> None:
    tool_definitions_seed()
    ToolDefinition.objects.filter(name="send_email").update(enabled=False)
    with django_assert_num_queries(3):
        response = api.get("/api/tools")
    assert response.status_code == 200
    tools = {t["name"]: t for t in response.json()}
    assert "send_email" not in tools and {"run_command", "read_file", "write_file", "list_files"} <= set(tools)
    assert tools["run_command"]["parameters_schema"]["required"] == ["command"]
    assert tools["run_command"]["approval_mode"] == ToolDefinition.objects.get(name="run_command").approval_mode
