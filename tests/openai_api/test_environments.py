"""A session's environment on the wire: ``none`` (no sandbox: workspace tools refused at creation and
never offered later) and ``self_hosted`` (pinned, in the creating transaction, to the host or pool
chosen); and ``spawn_subagents`` calls as the wire's subagent items, grandchildren included."""

import json
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from fanout_app.models import SubagentLink
from hosts_app import hooks
from hosts_app.models import SandboxHost, SessionPlacement
from openai_api.wire import WireStream
from sessions_app.engine.commands import session_start
from sessions_app.engine.llm import tools_param
from sessions_app.engine.tool_steps import tool_available
from sessions_app.models import AgentProfile, AgentSession, Event, Step
from tests import factories
from tests.helpers import api_client
from tools_app.selectors import tool_definitions_cache_clear
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db

BETA: dict[str, Any] = {"HTTP_OPENAI_BETA": "agents=v1"}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
WRITE_FILE = {"type": "function", "name": "write_file", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture
def wire_client(operator: User) -> Client:
    operator.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="sessions_app", codename__in=["add_agentprofile", "change_agentprofile"]))
    tool_definitions_seed()
    return api_client(operator)


def _post(client: Client, path: str, body: Any) -> Any:
    return client.post(f"/openai/v1{path}", json.dumps(body), content_type="application/json", **BETA)


def _get(client: Client, path: str) -> Any:
    return client.get(f"/openai/v1{path}", **BETA)


def _agent(client: Client, *tools: dict[str, Any]) -> str:
    response = _post(client, "/agents", {"model": "scripted", "tools": list(tools)})
    assert response.status_code == 200, response.content
    return str(response.json()["id"])


def test_a_none_session_refuses_an_agent_with_workspace_tools_and_changes_nothing(wire_client: Client) -> None:
    agent = _agent(wire_client, WEATHER, WRITE_FILE)
    refused = _post(wire_client, "/agents/sessions", {"environment": {"type": "none"}, "agent_id": agent,
                                                      "input": "hi"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "environment.type" and error["code"] == "unsupported_parameter"
    assert "write_file" in error["message"] and "self_hosted" in error["message"]
    assert not AgentSession.objects.exists() and not Event.objects.exists()


def test_a_none_session_is_never_offered_a_workspace_tool_added_later(wire_client: Client) -> None:
    agent = _agent(wire_client, WEATHER)
    SandboxHost.objects.create(name="shared-1", kind="hosted", pool="default", status="online")
    created = _post(wire_client, "/agents/sessions", {"environment": {"type": "none"}, "agent_id": agent,
                                                      "input": "hi"})
    assert created.status_code == 200, created.content
    assert created.json()["environment"] == {"type": "none"}
    # No sandbox: its ticks never pin it to a host (a host's load counts sessions with workspaces).
    hooks.cache_clear()
    none_session = AgentSession.objects.get(pk=created.json()["id"])
    assert not none_session.has_sandbox and hooks.host_of(none_session) is None
    assert not SessionPlacement.objects.filter(session=none_session).exists()
    hosted = _post(wire_client, "/agents/sessions", {"environment": {"type": "self_hosted"}, "agent_id": agent,
                                                     "input": "hi"})
    assert hosted.status_code == 200, hosted.content
    hosted_session = AgentSession.objects.get(pk=hosted.json()["id"])
    pinned = hooks.host_of(hosted_session)
    assert hosted_session.has_sandbox and pinned is not None and pinned.name == "shared-1"
    assert _post(wire_client, f"/agents/{agent}", {"tools": [WEATHER, WRITE_FILE]}).status_code == 200
    tool_definitions_cache_clear()
    session = AgentSession.objects.select_related("agent").get(pk=created.json()["id"])
    assert {t["function"]["name"] for t in tools_param(session.agent)} == {"get_weather", "write_file"}
    offered = tools_param(session.agent, session.metadata["agentops_tools"])
    assert [t["function"]["name"] for t in offered] == ["get_weather"]
    assert tool_available(session, "write_file") is None and tool_available(session, "get_weather") is not None
    # A metadata update on the wire keeps agentops's keys; the wire never shows them.
    updated = _post(wire_client, f"/agents/sessions/{session.id}", {"metadata": {"case": "b"}})
    assert updated.json()["metadata"] == {"case": "b"}
    session.refresh_from_db()
    assert session.metadata["agentops_tools"] == ["get_weather"] and session.metadata["case"] == "b"


def test_a_self_hosted_session_is_pinned_where_its_creator_chose(wire_client: Client, operator: User) -> None:
    agent = _agent(wire_client, WEATHER, WRITE_FILE)
    team = AgentProfile.objects.get(slug=agent).team
    SandboxHost.objects.create(name="shared-1", kind="hosted", pool="default", status="online")
    SandboxHost.objects.create(name="gpu-1", kind="hosted", pool="gpu", status="online")
    SandboxHost.objects.create(name="ours", kind="runner", team=team, status="online", token_hash="a" * 64)
    SandboxHost.objects.create(name="theirs", kind="runner", team=factories.team("other"), status="online",
                               token_hash="b" * 64)

    body = {"agent_id": agent, "input": "hi", "metadata": {"k": "v"}}
    on_runner = _post(wire_client, "/agents/sessions", {**body, "environment": {
        "type": "self_hosted", "workspace_directory": "/workspace", "environment_id": "ours"}})
    assert on_runner.status_code == 200, on_runner.content
    assert on_runner.json()["environment"] == {"type": "self_hosted", "id": "ours", "workspace_directory": "/workspace",
                                               "capability_directories": [], "remote_url": ""}
    session_id = on_runner.json()["id"]
    assert SessionPlacement.objects.get(session_id=session_id).host.name == "ours"
    assert Event.objects.filter(session_id=session_id, type="session.pinned", payload__host="ours").count() == 1

    in_pool = _post(wire_client, "/agents/sessions", {**body, "environment": {"type": "self_hosted",
                                                                               "agentops_pool": "gpu"}})
    assert in_pool.json()["environment"]["id"] == "gpu-1"

    default = _post(wire_client, "/agents/sessions", {**body, "environment": {"type": "self_hosted"}})
    assert default.json()["environment"]["id"] is None  # pinned by its first tick, in its agent's pool
    assert not SessionPlacement.objects.filter(session_id=default.json()["id"]).exists()

    count = AgentSession.objects.count()
    for environment, param in (({"environment_id": "theirs"}, "environment.environment_id"),
                               ({"agentops_pool": "empty"}, "environment.agentops_pool")):
        refused = _post(wire_client, "/agents/sessions", {**body, "environment": {"type": "self_hosted",
                                                                                   **environment}})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param
    assert AgentSession.objects.count() == count  # the refused ones rolled back whole

    # The same session through agentops's own API: its environment is in its metadata.
    own = api_client(operator).get(f"/api/sessions/{session_id}").json()
    assert own["metadata"]["agentops_environment"] == {"type": "self_hosted", "environment_id": "ours",
                                                      "pool": None}
    listed = _get(wire_client, f"/agents/sessions?agent_id={agent}&order=asc").json()["data"]
    assert [s["environment"]["id"] for s in listed] == ["ours", "gpu-1", None]


def _spawned(operator: User) -> tuple[AgentSession, AgentSession, AgentSession, Step]:
    """A root whose spawn step started a child that spawned a grandchild; the root's step has collected."""
    agent = factories.agent_profile()
    root, turn = session_start(agent=agent, owner=operator, input="go")
    child, child_turn = session_start(agent=agent, owner=operator, input="part 0")
    grandchild, grand_turn = session_start(agent=agent, owner=operator, input="part 0.0")
    assert turn is not None and child_turn is not None and grand_turn is not None
    tasks = {"tasks": [{"instructions": "Do part 0."}]}
    step = factories.step(turn, tool_name="spawn_subagents", call_id="call_spawn")
    Step.objects.filter(pk=step.pk).update(arguments=tasks, status=Step.Status.COMPLETED, result={
        "status": "completed", "output": "…", "subagents": [{"index": 0, "session_id": str(child.id),
                                                            "status": "completed", "answer": "part 0 done"}]})
    SubagentLink.objects.create(child=child, parent=root, root=root, parent_step=step, index=0, depth=1,
                                agent_path="a#0", task={"instructions": "Do part 0."})
    nested = factories.step(child_turn, tool_name="spawn_subagents", call_id="call_spawn2")
    Step.objects.filter(pk=nested.pk).update(arguments={"tasks": [{"instructions": "Do part 0.0."}]},
                                             status=Step.Status.RUNNING)
    SubagentLink.objects.create(child=grandchild, parent=child, root=root, parent_step=nested, index=0, depth=2,
                                agent_path="a#0 › a#0", task={"instructions": "Do part 0.0."})
    return root, child, grandchild, step


def test_subagent_calls_are_the_wires_items_on_the_parents_turn(operator: User) -> None:
    root, child, grandchild, step = _spawned(operator)
    client = api_client(operator)
    items = _get(client, f"/agents/sessions/{root.id}/turns/{step.turn_id}/items?order=asc").json()["data"]
    assert [i["type"] for i in items] == ["message", "create_subagent_call", "wait_for_subagents_call",
                                          "agent_message"]
    create, wait, answer = items[1:]
    assert create["agent_id"] == root.agent.slug and create["agentops_subagent_id"] == str(child.id)
    assert create["content"][0]["text"] == "Do part 0." and create["status"] == "completed"
    assert wait["recipient_agent_ids"] == [str(child.id)] and wait["status"] == "completed"
    assert (answer["sender_agent_id"], answer["recipient_agent_id"]) == (str(child.id), root.agent.slug)
    assert answer["content"][0]["text"] == "part 0 done"
    assert [i["type"] for i in _get(client, f"/agents/sessions/{root.id}/items?order=asc").json()["data"]] == \
        [i["type"] for i in items]

    # The grandchild, reached through the root's subagents endpoints: its parent is the child.
    base = f"/agents/sessions/{root.id}/subagents"
    grand = _get(client, f"{base}/{grandchild.id}").json()
    assert grand["parent_agent_id"] == str(child.id) and grand["agentops_depth"] == 2
    turns = _get(client, f"{base}/{grandchild.id}/turns").json()["data"]
    assert [(t["subagent_id"], t["session_id"]) for t in turns] == [(str(grandchild.id), str(root.id))]
    grand_items = _get(client, f"{base}/{grandchild.id}/turns/{turns[0]['id']}/items").json()["data"]
    assert [i["content"][0]["text"] for i in grand_items] == ["part 0.0"]
    # The child's own spawn, still waiting: its create call names the grandchild, the wait is in progress.
    child_items = _get(client, f"{base}/{child.id}/items?order=asc").json()["data"]
    assert [(i["type"], i.get("status")) for i in child_items] == [
        ("message", "completed"), ("create_subagent_call", "completed"), ("wait_for_subagents_call", "in_progress")]
    assert child_items[1]["agent_id"] == str(child.id) and child_items[1]["agentops_subagent_id"] == str(grandchild.id)


def test_a_spawn_streams_as_subagent_items_and_events() -> None:
    stream = WireStream(snapshot={"id": "s1", "object": "agent.session", "agent": {"id": "agent_x"},
                                  "status": "in_progress", "required_actions": [], "error": None})
    step, turn, at = "5a0f0000-0000-0000-0000-000000000001", "5a0f0000-0000-0000-0000-000000000002", \
        "2026-12-01T00:00:00+00:00"
    kids = [{"index": 0, "session_id": "c0", "title": "t0", "instructions": "A.", "turn_id": "t-c0", "agent": "kid"},
            {"index": 1, "session_id": "c1", "title": "t1", "instructions": "B.", "turn_id": "t-c1", "agent": "kid"}]
    tasks = {"tasks": [{"instructions": "A."}, {"instructions": "B."}]}
    answers = [{"index": 0, "session_id": "c0", "answer": "a"}, {"index": 1, "session_id": "c1", "answer": "b"}]
    out = []
    for seq, (kind, payload) in enumerate([
            ("tool.started", {"index": 2, "tool": "spawn_subagents", "arguments": tasks}),
            ("subagents.spawned", {"index": 2, "tool": "spawn_subagents", "children": kids}),
            ("subagent.finished", {"index": 0, "session_id": "c0", "status": "completed", "turn_id": "t-c0"}),
            ("subagent.finished", {"index": 1, "session_id": "c1", "status": "failed", "turn_id": "t-c1",
                                   "error_code": "budget_exceeded", "error_message": "over budget"}),
            # As the live event carries it: the answers in the output the parent's model read.
            ("tool.completed", {"index": 2, "tool": "spawn_subagents",
                                "result": {"status": "completed", "output": json.dumps({"subagents": answers})}})],
            1):
        out += stream.translate({"seq": seq, "type": kind, "session_id": "s1", "turn_id": turn, "step_id": step,
                                 "payload": payload, "created_at": at})
    shape = [(e["type"], e.get("item", {}).get("type")) for e in out]
    assert shape == [
        *[("agent.session.subagent.created", None), ("agent.session.turn.created", None)] * 2,
        *[("agent.session.turn.item.added", "create_subagent_call"),
          ("agent.session.turn.item.done", "create_subagent_call")] * 2,
        ("agent.session.turn.item.added", "wait_for_subagents_call"),
        ("agent.session.turn.completed", None), ("agent.session.subagent.closed", None),
        ("agent.session.turn.failed", None), ("agent.session.subagent.closed", None),
        ("agent.session.turn.item.added", "agent_message"), ("agent.session.turn.item.added", "agent_message"),
        ("agent.session.turn.item.done", "wait_for_subagents_call")]
    assert [e["item"]["content"][0]["text"] for e in out if e.get("item", {}).get("type") == "create_subagent_call"
            and e["type"].endswith("done")] == ["A.", "B."]
    assert out[-1]["item"]["status"] == "completed" and out[-1]["item"]["recipient_agent_ids"] == ["c0", "c1"]
    # The children's turns: in the root's stream with their subagent id, so the SDK's stream helper
    # (which follows the first root turn, subagent_id None) keeps following the caller's turn.
    turns = [(e["type"].rsplit(".", 1)[1], e["turn"]["id"], e["turn"]["subagent_id"], e["turn"]["session_id"],
              e["turn"]["status"]) for e in out if e["type"].startswith("agent.session.turn.") and "turn" in e]
    assert turns == [("created", "t-c0", "c0", "s1", "queued"), ("created", "t-c1", "c1", "s1", "queued"),
                     ("completed", "t-c0", "c0", "s1", "completed"), ("failed", "t-c1", "c1", "s1", "failed")]
    failed = next(e["turn"] for e in out if e["type"] == "agent.session.turn.failed")
    assert failed["error"]["message"] == "over budget" and failed["agent_id"] == "kid"
    assert failed["completed_at"] is not None
