"""The live translation of agentops events into wire events (``openai_api.wire.WireStream``)."""

import json
import uuid
from typing import Any

import pytest

from openai_api.wire import WireStream

SESSION = str(uuid.uuid4())
TURN = str(uuid.uuid4())
STEP = str(uuid.uuid4())
AT = "2026-12-01T00:00:00+00:00"


def _stream() -> WireStream:
    return WireStream(snapshot={"id": SESSION, "object": "agent.session", "agent": {"id": "agent_x"},
                                "status": "idle", "required_actions": [], "error": None})


def _feed(stream: WireStream, *events: tuple[str, dict[str, Any], str | None]) -> list[dict[str, Any]]:
    out = []
    for seq, (kind, payload, step) in enumerate(events, start=1):
        out += stream.translate({"seq": seq, "type": kind, "session_id": SESSION, "turn_id": TURN, "step_id": step,
                                 "payload": payload, "created_at": AT})
    return out


def test_a_client_call_is_announced_then_required_and_settled_by_its_output() -> None:
    out = _feed(_stream(),
                ("turn.queued", {"index": 1, "input": "go"}, None),
                ("session.status_changed", {"status": "in_progress"}, None),
                ("turn.started", {"status": "running"}, None),
                ("tool.started", {"client": True, "call_id": "call_1", "tool": "get_weather", "index": 2,
                                  "arguments": {"city": "Paris"}}, STEP),
                ("turn.requires_action", {}, None),
                ("session.status_changed", {"status": "requires_action"}, None),
                ("tool.completed", {"client": True, "result": {"status": "completed", "output": "sunny"}}, STEP),
                ("turn.started", {}, None),
                ("session.status_changed", {"status": "in_progress"}, None),
                ("model.completed", {"content": "It is sunny.", "tool_calls": [], "index": 3}, str(uuid.uuid4())),
                ("turn.completed", {"output_text": "It is sunny."}, None),
                ("session.status_changed", {"status": "idle"}, None))
    types = [e["type"] for e in out]
    assert types == [
        "agent.session.turn.created", "agent.session.turn.item.added", "agent.session.in_progress",
        "agent.session.turn.in_progress", "agent.session.turn.item.added", "agent.session.turn.item.done",
        "agent.session.requires_action", "agent.session.turn.item.added", "agent.session.turn.in_progress",
        "agent.session.in_progress", "agent.session.turn.item.added", "agent.session.turn.output_text.done",
        "agent.session.turn.item.done", "agent.session.turn.completed", "agent.session.idle"]
    call = out[4]["item"]
    assert (call["type"], call["call_id"], call["turn_id"], call["arguments"]) == \
        ("function_call", "call_1", TURN, {"city": "Paris"})
    required = out[6]["session"]["required_actions"]
    assert required == [{"type": "function_call", "turn_id": TURN, "call_id": "call_1", "name": "get_weather",
                         "arguments": '{"city": "Paris"}'}]
    assert out[7]["item"]["type"] == "function_call_output" and out[7]["item"]["output"] == "sunny"
    final = out[12]["item"]
    assert (final["phase"], final["status"], final["content"]) == \
        ("final_answer", "completed", [{"type": "output_text", "text": "It is sunny."}])
    assert out[14]["session"]["required_actions"] == []
    assert len({e["event_id"] for e in out}) == len(out)
    assert all(e["turn"]["subagent_id"] is None for e in out if "turn" in e)


def test_a_failed_turn_carries_its_error_before_the_failed_session() -> None:
    request_id = str(uuid.uuid4())
    out = _feed(_stream(),
                ("turn.queued", {"index": 1, "input": "go"}, None),
                ("approval.requested", {"request_id": request_id, "tool": "write_file", "arguments": {"path": "a"},
                                        "arguments_sha256": "ab" * 32, "risk": "medium"}, STEP),
                ("session.status_changed", {"status": "awaiting_approval"}, None),
                ("approval.expired", {"request_id": request_id}, STEP),
                ("turn.failed", {"error_code": "budget_exceeded", "error_message": "Token budget reached"}, None),
                ("session.status_changed", {"status": "failed"}, None))
    types = [e["type"] for e in out]
    assert types[-2:] == ["agent.session.turn.failed", "agent.session.failed"]
    [approval] = out[2]["session"]["required_actions"]
    assert approval["type"] == "mcp_approval_request" and approval["request_id"] == request_id
    assert out[-2]["turn"]["error"] == {"code": "usage_limit_exceeded", "message": "Token budget reached"}
    assert out[-1]["session"]["error"] == "Token budget reached" and out[-1]["session"]["required_actions"] == []


def test_streamed_text_is_one_message_item_at_its_step_index() -> None:
    model_step = str(uuid.uuid4())
    out = _feed(_stream(),
                ("turn.queued", {"index": 1, "input": "go"}, None),
                ("model.started", {"index": 3, "kind": "model"}, model_step),
                ("model.delta", {"text": "It is "}, model_step),
                ("model.delta", {"text": "sunny."}, model_step),
                ("model.completed", {"content": "It is sunny.", "tool_calls": [], "index": 3}, model_step))[2:]
    assert [e["type"] for e in out] == [
        "agent.session.turn.item.added", "agent.session.turn.output_text.delta",
        "agent.session.turn.output_text.delta", "agent.session.turn.output_text.done",
        "agent.session.turn.item.done"]
    assert {e["output_index"] for e in out} == {3}
    assert {e.get("item_id") or e["item"]["id"] for e in out} == {f"msg_{uuid.UUID(model_step).hex}"}
    assert "".join(e["delta"] for e in out if "delta" in e) == out[-1]["item"]["content"][0]["text"]


def test_a_stream_resumed_after_a_seq_gives_each_event_the_ids_it_had_live() -> None:
    """Resumed after the model's first delta, model.completed gave an item.added again (the client
    had it) and so renumbered its events: evt_7_0 was output_text.done live and item.added resumed,
    and the SDK, which drops repeated event_ids, kept the wrong ones. An mcp_call's item.done also
    lost the arguments its item.added carried, and a rejection its reason (a wire audit, 2026-12-04)."""
    from openai_api.wire import StreamSeen

    tool_step = str(uuid.uuid4())
    events: list[tuple[str, dict[str, Any], str | None]] = [
              ("turn.queued", {"index": 1, "input": "go"}, None), ("turn.started", {}, None),
              ("model.started", {"index": 0}, STEP), ("model.delta", {"text": "look"}, STEP),
              ("model.completed", {"index": 0, "content": "looking", "tool_calls": [{"id": "c"}]}, STEP),
              ("tool.started", {"index": 1, "tool": "tracker__open", "arguments": {"title": "x"}}, tool_step),
              ("tool.rejected", {"index": 1, "tool": "tracker__open", "reason": "not today"}, tool_step)]
    live = _feed(_stream(), *events)
    by_id = {e["event_id"]: e for e in live}
    delta_seq = 4
    resumed_stream = WireStream(snapshot=_stream().snapshot, seen=StreamSeen(frozenset({STEP}), {}))
    resumed = []
    for seq, (kind, payload, step) in enumerate(events, start=1):
        if seq > delta_seq:
            resumed += resumed_stream.translate({"seq": seq, "type": kind, "session_id": SESSION, "turn_id": TURN,
                                                 "step_id": step, "payload": payload, "created_at": AT})
    assert [e["event_id"] for e in resumed] == [e["event_id"] for e in live if int(e["event_id"].split("_")[1]) > 4]
    assert all(e == by_id[e["event_id"]] for e in resumed)
    done = [e for e in live if e["type"] == "agent.session.turn.item.done" and e["item"]["type"] == "mcp_call"]
    assert json.loads(done[0]["item"]["arguments"]) == {"title": "x"}
    assert done[0]["item"]["error"] == "The reviewer rejected this call. Reason: not today"
    # resumed after tool.started: its arguments come from what the client saw (stream_seen)
    seen = StreamSeen(frozenset({STEP}), {tool_step: {"title": "x"}})
    after_start = WireStream(snapshot=_stream().snapshot, seen=seen)
    (again,) = after_start.translate({"seq": 7, "type": "tool.rejected", "session_id": SESSION, "turn_id": TURN,
                                      "step_id": tool_step, "payload": events[6][1], "created_at": AT})
    assert again == done[0]


@pytest.mark.django_db
def test_what_a_resuming_client_saw_is_read_from_the_active_turns_events() -> None:
    from sessions_app.events import event_record
    from sessions_app.selectors import stream_seen
    from sessions_app.services import turn_create
    from tests import factories

    session = factories.session()
    turn = turn_create(session_id=session.id, input="go")
    model = factories.step(turn, kind="model", tool_name="", index=0)
    tool = factories.step(turn, tool_name="list_files", index=1)
    event_record(session_id=session.id, turn_id=turn.id, step_id=model.id, type="model.delta", payload={"text": "a"})
    event_record(session_id=session.id, turn_id=turn.id, step_id=tool.id, type="tool.started",
                 payload={"tool": "list_files", "arguments": {"path": "."}})
    last = session.__class__.objects.get(pk=session.pk).last_seq
    assert stream_seen(session.id, last) == ({str(model.id)}, {str(tool.id): {"path": "."}})
    assert stream_seen(session.id, last - 2) == (set(), {})  # before either
