# mypy: disable-error-code="list-item, union-attr, func-returns-value"
"""Conformance: the official openai SDK's ``client.beta.agents``, unchanged, against agentops at
/openai/v1: live daphne, a Celery worker, the model gateway, the scripted model and bubblewrap."""

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from django.contrib.auth.models import Permission
from openai import OpenAI
from openai.lib.beta.agents import function_tool

from agentops.models import TeamMembership, TeamRole
from approvals_app.models import ApprovalRequest
from sessions_app.models import AgentSession, Event, Turn
from tests.e2e.conftest import ROOT, Stack, World
from tests.helpers import api_token, login, script, tool

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

REPORT = "Paris report"


@pytest.fixture(scope="module")
def stack_env() -> dict[str, str]:
    return {"AGENTOPS_MAX_ACTIVE_SESSIONS_PER_USER": "3"}


@function_tool
def get_weather(city: str) -> str:
    """Get the weather for a city."""
    return f"sunny in {city}"


SELF_HOSTED: Any = {"type": "self_hosted", "workspace_directory": "/workspace"}
WRITE_FILE = {"type": "function", "name": "write_file", "description": "agentops's built-in",
              "parameters": {"type": "object", "properties": {}}}


def _client(stack: Stack, token: str, **kwargs: Any) -> OpenAI:
    return OpenAI(base_url=f"{stack.url}/openai/v1", api_key=token, **kwargs)


@pytest.fixture
def sdk(world: World, stack: Stack) -> Iterator[OpenAI]:
    world.operator.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="sessions_app", codename__in=["add_agentprofile", "change_agentprofile",
                                                              "delete_agentprofile"]))
    client = _client(stack, api_token(world.operator))
    yield client
    client.close()


def _until_idle(stream: Any, on_event: Any = None) -> list[Any]:
    """Iterate a session event stream until the session is idle (or failed) after a finished turn."""
    events = []
    turn_done = False
    for event in stream:
        events.append(event)
        if on_event is not None:
            on_event(event)
        if event.type in ("agent.session.turn.completed", "agent.session.turn.failed",
                          "agent.session.turn.cancelled") and event.turn.subagent_id is None:  # a root turn
            turn_done = True
        if event.type == "agent.session.failed" or (event.type == "agent.session.idle" and turn_done):
            break
    return events


def test_the_sdk_runs_a_session_with_client_tools_and_a_reviewed_builtin(sdk: OpenAI, world: World,
                                                                          stack: Stack) -> None:
    """agents.create → sessions.create(stream=True, tool_handlers=…) → a @function_tool run by the
    SDK → write_file approved by a reviewer in agentops → the stream goes on → the result helper;
    then sessions.stream over more turns, an approval answered through the SDK, cancel, turn items
    to the end, the artifact downloaded, and the same session read through agentops's own API."""
    agent = sdk.beta.agents.create(model="scripted", name="Weather", instructions="Be brief.",
                                   metadata={"team": "wire"}, tools=[get_weather.definition, WRITE_FILE])
    assert agent.id.startswith("agent_") and agent.metadata == {"team": "wire"}
    assert {t.name for t in agent.tools} == {"get_weather", "write_file"}
    assert sdk.beta.agents.retrieve(agent.id).name == "Weather"

    reviewer_api = httpx.Client(base_url=f"{stack.url}/api",
                                headers={"Authorization": f"Bearer {api_token(world.reviewer)}"})
    decided: list[str] = []

    def review(event: Any) -> None:
        if event.type != "agent.session.requires_action":
            return
        for action in event.session.required_actions:
            if action.type == "mcp_approval_request" and action.request_id not in decided:
                # The request ID on the wire is agentops's: a reviewer decides it in agentops.
                reply = reviewer_api.post(f"/approvals/{action.request_id}/decision", json={
                    "decision": "approve", "arguments_sha256": action.request.to_dict()["arguments_sha256"]})
                assert reply.status_code == 200, reply.text
                decided.append(action.request_id)

    stream = sdk.beta.agents.sessions.create(  # write_file needs a workspace: agentops's sandbox hosts
        environment=SELF_HOSTED, agent_id=agent.id, metadata={"case": "conformance"}, stream=True,
        input=script(tool("get_weather", city="Paris"),
                     tool("write_file", path="outputs/report.txt", content=REPORT),
                     "say Done: {results}"),
        tool_handlers={"get_weather": get_weather}).with_result_collection()
    events = _until_idle(stream, review)
    result = stream.get_final_result()

    types = [e.type for e in events]
    assert types[0] == "agent.session.created"
    assert "sunny in Paris" in result.output_text and "Done:" in result.output_text
    assert len(decided) == 1
    # The function call is announced (its pending call registered) before the SDK answers it;
    # the terminal turn event comes before the session's idle.
    added = next(i for i, e in enumerate(events) if e.type == "agent.session.turn.item.added"
                 and e.item.type == "function_call")
    output = next(i for i, e in enumerate(events) if e.type == "agent.session.turn.item.added"
                  and e.item.type == "function_call_output")
    assert added < output
    assert types.index("agent.session.turn.completed") < len(types) - 1 and types[-1] == "agent.session.idle"
    assert len({e.event_id for e in events}) == len(events)
    final_id = result.messages[0].id
    assert "".join(e.delta for e in events if e.type == "agent.session.turn.output_text.delta"
                   and e.item_id == final_id) == result.output_text
    session_id = result.session_id
    approval = ApprovalRequest.objects.get(request_id=decided[0])
    assert str(approval.session_id) == session_id and approval.decided_by == world.reviewer

    # The same session through agentops's own API and database: one source of truth.
    own = httpx.get(f"{stack.url}/api/sessions/{session_id}",
                    headers={"Authorization": f"Bearer {api_token(world.operator)}"}).json()
    assert own["status"] == "idle" and own["metadata"]["case"] == "conformance"
    assert own["metadata"]["agentops_environment"]["type"] == "self_hosted"
    assert sdk.beta.agents.sessions.retrieve(session_id).environment.type == "self_hosted"
    turn = Turn.objects.get(pk=result.turn_id)
    assert turn.status == Turn.Status.COMPLETED and turn.output_text == result.output_text
    dashboard = login(world.operator).get(f"/sessions/{session_id}/")  # the session on the dashboard
    assert dashboard.status_code == 200 and "report.txt" in dashboard.content.decode()
    assert Event.objects.filter(session_id=uuid.UUID(session_id), type="approval.decided").count() == 1

    # Artifacts: write_file published outputs/report.txt; the SDK downloads it.
    artifacts = list(sdk.beta.agents.sessions.artifacts.list(session_id))
    assert [a.path for a in artifacts] == ["/workspace/outputs/report.txt"]
    assert sdk.beta.agents.sessions.artifacts.for_result(result).content(
        "/workspace/outputs/report.txt").read() == REPORT.encode()
    assert sdk.beta.agents.sessions.artifacts.retrieve(artifacts[0].id, session_id=session_id).size_bytes == len(REPORT)

    # sessions.stream over two more turns on the idle session, the second with parallel calls.
    with sdk.beta.agents.sessions.stream(session_id, input=script(tool("get_weather", city="Rome"), "say {results}"),
                                         tool_handlers={"get_weather": get_weather}) as live:
        assert "sunny in Rome" in live.get_final_result().output_text
    with sdk.beta.agents.sessions.stream(session_id, tool_handlers={"get_weather": get_weather}, input=script(
            "parallel", tool("get_weather", city="Oslo"), tool("get_weather", city="Lima"), "end",
            "say {results}")) as live:
        both = live.get_final_result().output_text
    assert "sunny in Oslo" in both and "sunny in Lima" in both

    # An approval answered through the SDK: the session's owner may not, even holding the reviewer
    # permission (four-eyes); another reviewer may.
    world.operator.user_permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    TeamMembership.objects.filter(user=world.operator).update(role=TeamRole.BOTH)  # a reviewer in the team too
    reviewer_sdk = _client(stack, api_token(world.reviewer))
    seen: list[Any] = []

    def answer(event: Any) -> None:
        if event.type != "agent.session.requires_action":
            return
        for action in event.session.required_actions:
            if action.type != "mcp_approval_request" or action.request_id in seen:
                continue
            seen.append(action.request_id)
            answer_event = {"type": "agent.session.input.mcp_approval_request_result", "request_id": action.request_id,
                            "response": {"type": "mcp_tool_call", "decision": "approve"}}
            with pytest.raises(openai.PermissionDeniedError) as refused:
                sdk.beta.agents.sessions.events.create(session_id, events=[answer_event])
            assert refused.value.body["code"] == "self_approval_forbidden"  # type: ignore[index]
            reviewer_sdk.beta.agents.sessions.events.create(session_id, events=[answer_event],
                                                            idempotency_key=str(uuid.uuid4()))

    events_stream = sdk.beta.agents.sessions.events.stream(session_id)
    sdk.beta.agents.sessions.events.create(session_id, idempotency_key=str(uuid.uuid4()), events=[{
        "type": "agent.session.input.message", "input": [{"role": "user", "content": [{
            "type": "input_text", "text": script(tool("write_file", path="outputs/more.txt", content="x"),
                                                 "say written")}]}]}])
    later = _until_idle(events_stream, answer)
    events_stream.close()
    assert len(seen) == 1 and ApprovalRequest.objects.get(request_id=seen[0]).decided_by == world.reviewer
    assert [e for e in later if e.type == "agent.session.turn.completed"]

    # Cancel a running turn: turn.cancelled, then idle.
    events_stream = sdk.beta.agents.sessions.events.stream(session_id)
    sdk.beta.agents.sessions.events.create(session_id, events=[{
        "type": "agent.session.input.message", "input": [{"role": "user", "content": [{
            "type": "input_text", "text": script("sleep 20000", "say too late")}]}]}])
    cancelled = _until_idle(events_stream, lambda e: e.type == "agent.session.turn.in_progress" and
                            sdk.beta.agents.sessions.events.create(session_id, events=[
                                {"type": "agent.session.input.cancel"}]))
    events_stream.close()
    kinds = [e.type for e in cancelled]
    assert kinds.index("agent.session.turn.cancelled") < kinds.index("agent.session.idle")
    assert sdk.beta.agents.sessions.retrieve(session_id).status == "idle"

    # From a cursor (agentops's event seq, an extension of the wire): the history replays in order.
    replay = sdk.beta.agents.sessions.events.stream(session_id, extra_query={"after": 0})
    replayed = []
    for event in replay:
        replayed.append(event)
        if sum(e.type == "agent.session.turn.completed" for e in replayed) == 1:
            break
    replay.close()
    assert [e.event_id for e in replayed] == [e.event_id for e in events[:len(replayed)]]

    # Turns and items, page by page to the end.
    turns = list(sdk.beta.agents.sessions.turns.list(session_id, limit=2, order="asc"))
    assert [t.status for t in turns] == ["completed", "completed", "completed", "completed", "cancelled"]
    assert turns[0].id == result.turn_id and turns[0].subagent_id is None
    page = sdk.beta.agents.sessions.turns.items.list(result.turn_id, session_id=session_id, limit=2, order="asc")
    items = list(page)  # auto-pagination follows last_id
    everything = sdk.beta.agents.sessions.turns.items.list(result.turn_id, session_id=session_id, limit=100,
                                                           order="asc").data
    assert [i.id for i in items] == [i.id for i in everything] and len(items) > 2
    assert [i.type for i in items] == ["message", "function_call", "function_call_output", "mcp_call", "message"]
    final = items[-1]
    assert final.type == "message" and final.phase == "final_answer" and final.content[0].text == result.output_text
    assert list(sdk.beta.agents.sessions.subagents.list(session_id)) == []
    assert sdk.beta.agents.sessions.turns.retrieve(result.turn_id, session_id=session_id).status == "completed"
    session_items = list(sdk.beta.agents.sessions.items.list(session_id, limit=3, order="asc"))  # after = last id
    newest = sdk.beta.agents.sessions.items.list(session_id, limit=1).data  # the wire's default order: desc
    assert newest[0].id == session_items[-1].id
    assert [i.id for i in session_items[:len(items)]] == [i.id for i in items]
    assert len({i.id for i in session_items}) == len(session_items) > 3 * len(turns)

    listed = sdk.beta.agents.sessions.list(agent_id=agent.id, metadata={"case": "conformance"})
    assert [s.id for s in listed] == [session_id]
    updated = sdk.beta.agents.sessions.update(session_id, metadata={"case": "done"})
    assert updated.metadata == {"case": "done"}
    assert AgentSession.objects.get(pk=session_id).metadata["case"] == "done"
    assert sdk.beta.agents.sessions.delete(session_id).deleted
    assert not AgentSession.objects.filter(pk=session_id).exists()
    reviewer_api.close()
    reviewer_sdk.close()


def test_the_readme_example_runs_as_written(sdk: OpenAI, world: World, stack: Stack,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- sdk-example -->", 1)[1].split("<!-- /sdk-example -->", 1)[0]
    code = block.split("```python\n", 1)[1].rsplit("```", 1)[0]
    namespace = {"OpenAI": OpenAI, "function_tool": function_tool, "AGENTOPS_URL": stack.url,
                 "TOKEN": api_token(world.operator)}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
    assert capsys.readouterr().out == "get_weather: sunny in Paris\n"
    assert AgentSession.objects.filter(owner=world.operator, status=AgentSession.Status.IDLE).count() == 1


def test_every_error_class_reaches_the_sdk_as_its_exception(sdk: OpenAI, world: World, stack: Stack) -> None:
    strict = _client(stack, api_token(world.operator), max_retries=0)
    agent = strict.beta.agents.create(model="scripted", tools=[get_weather.definition])

    with pytest.raises(openai.BadRequestError) as bad:
        strict.beta.agents.sessions.create(environment={"type": "openai_hosted"}, agent_id=agent.id, input="hi")
    assert bad.value.body["param"] == "environment.type"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        strict.beta.agents.create(model="scripted", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError):
        strict.beta.agents.create(model="scripted", multi_agent={"enabled": True})
    with pytest.raises(openai.BadRequestError):
        strict.beta.agents.vaults.create(name="secrets")
    writer = strict.beta.agents.create(model="scripted", tools=[WRITE_FILE])
    with pytest.raises(openai.BadRequestError) as no_sandbox:  # none: no workspace for write_file
        strict.beta.agents.sessions.create(environment={"type": "none"}, agent_id=writer.id, input="hi")
    assert no_sandbox.value.body["param"] == "environment.type"  # type: ignore[index]

    with pytest.raises(openai.AuthenticationError):
        _client(stack, "not-a-token", max_retries=0).beta.agents.list()
    with pytest.raises(openai.PermissionDeniedError):
        _client(stack, api_token(world.reviewer), max_retries=0).beta.agents.create(model="scripted")
    with pytest.raises(openai.NotFoundError):
        strict.beta.agents.retrieve("agent_missing")

    session = strict.beta.agents.sessions.create(environment={"type": "none"}, agent_id=agent.id,
                                                 input=script("sleep 30000", "say late"))
    message = {"type": "agent.session.input.message", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "more"}]}]}
    with pytest.raises(openai.ConflictError) as conflict:
        strict.beta.agents.sessions.events.create(session.id, events=[message])
    assert conflict.value.response.headers["x-should-retry"] == "false"
    assert conflict.value.body["code"] == "active_turn_not_steerable"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as unknown:
        strict.beta.agents.sessions.events.create(session.id, events=[{
            "type": "agent.session.input.tool_result", "turn_id": str(uuid.uuid4()), "call_id": "call_x",
            "success": True, "output": "x"}])
    assert unknown.value.body == {"code": "invalid_request_error", "message": "Unknown pending tool call: call_x",
                                  "type": "invalid_request_error", "param": "call_id"}

    key = str(uuid.uuid4())
    strict.beta.agents.sessions.events.create(session.id, events=[{"type": "agent.session.input.cancel"}],
                                              idempotency_key=key)
    with pytest.raises(openai.UnprocessableEntityError):
        strict.beta.agents.sessions.events.create(session.id, events=[message], idempotency_key=key)

    for _ in range(3):
        strict.beta.agents.sessions.create(environment={"type": "none"}, agent_id=agent.id,
                                           input=script("sleep 30000", "say late"))
    with pytest.raises(openai.RateLimitError):
        strict.beta.agents.sessions.create(environment={"type": "none"}, agent_id=agent.id, input="one more")
    strict.close()


def test_a_streamed_create_retried_with_its_idempotency_key_streams_the_first_session(sdk: OpenAI,
                                                                                         world: World) -> None:
    """A streamed answer is not remembered by the Idempotency-Key middleware: the SDK's retry of a
    create whose stream broke made a second session (a wire audit, 2026-12-04)."""
    agent = sdk.beta.agents.create(model="scripted", name="retried")
    key = str(uuid.uuid4())
    ids = []
    for _ in range(2):
        stream = sdk.beta.agents.sessions.create(environment={"type": "none"}, agent_id=agent.id, input="say once",
                                                 stream=True, extra_headers={"Idempotency-Key": key})
        first = next(iter(stream))
        stream.close()
        assert first.type == "agent.session.created"
        ids.append(first.session.id)
    assert ids[0] == ids[1]
    assert AgentSession.objects.filter(agent__name="retried").count() == 1
    with pytest.raises(openai.UnprocessableEntityError):
        sdk.beta.agents.sessions.create(environment={"type": "none"}, agent_id=agent.id, input="say other",
                                        stream=True, extra_headers={"Idempotency-Key": key})
