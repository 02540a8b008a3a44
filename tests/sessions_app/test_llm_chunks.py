"""Streamed chat-completion chunks folded from their JSON: text, tool calls in pieces, usage, the
finish reason; a chunk of another shape changes nothing and raises nothing."""

from typing import Any

from sessions_app.engine.llm import ModelReply, chunk_fold


def _fold(chunks: list[Any]) -> tuple[ModelReply, list[dict[str, str]], list[str]]:
    reply, calls = ModelReply(), {}  # type: ignore[var-annotated]
    texts = [chunk_fold(reply, calls, chunk) for chunk in chunks]
    return reply, [calls[i] for i in sorted(calls)], texts


def test_text_tool_calls_in_pieces_usage_and_finish_reason() -> None:
    reply, calls, texts = _fold([
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}],
         "usage": None},
        {"choices": [{"index": 0, "delta": {"content": "lo"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 1, "id": "call_b", "function": {"name": "list_", "arguments": ""}},
            {"index": 0, "id": "call_a", "function": {"name": "read_file", "arguments": "{\"pa"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "th\": \"a\"}"}},
            {"index": 1, "function": {"name": "files", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}},
    ])
    assert reply.content == "Hello" and texts == ["Hel", "lo", "", "", ""]
    assert calls == [{"id": "call_a", "name": "read_file", "arguments": "{\"path\": \"a\"}"},
                     {"id": "call_b", "name": "list_files", "arguments": "{}"}]
    assert (reply.prompt_tokens, reply.completion_tokens, reply.finish_reason) == (12, 5, "tool_calls")


def test_chunks_of_another_shape_change_nothing() -> None:
    reply, calls, texts = _fold([
        None, 7, "data", [], {"choices": 3}, {"choices": "abc"}, {"choices": [None, 1, {"delta": "x"}]},
        {"choices": [{"delta": {"content": 5, "tool_calls": {"index": 0}}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": "0", "function": {"name": "x"}}, {"index": True},
                                               None, {"index": 0, "function": "f"}]}}]},
        {"usage": {"prompt_tokens": "many", "completion_tokens": -3}},
        {"choices": [{"delta": {}, "finish_reason": 9}]},
    ])
    assert reply.content == "" and set(texts) == {""}
    assert calls == [{"id": "", "name": "", "arguments": ""}]  # index 0 with a function of no shape
    assert (reply.prompt_tokens, reply.completion_tokens, reply.finish_reason) == (0, 0, "")


def test_request_bodies_are_the_sdks_json_and_encode_each_message_once(monkeypatch: Any) -> None:
    import json

    from openai._utils._json import openapi_dumps

    from sessions_app.engine import llm

    encoded: list[Any] = []
    real = llm._dumps

    def counting(value: Any) -> bytes:
        encoded.append(value)
        return real(value)

    monkeypatch.setattr(llm, "_dumps", counting)
    tools = [{"type": "function", "function": {"name": "list_files", "parameters": {"type": "object"}}}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Sé bref."}, {"role": "user", "content": "ls"}]
    bodies = llm.RequestBodies()

    def sdk(messages: list[dict[str, Any]]) -> bytes:  # what client.post(body=...) would have sent
        return openapi_dumps({"model": "m", "messages": messages, "stream": True,
                              "stream_options": {"include_usage": True}, "tools": tools})

    assert json.loads(bodies.body(model="m", messages=messages, tools=tools)) == json.loads(sdk(messages))
    assert "Sé bref" in bodies.body(model="m", messages=messages, tools=tools).decode()  # UTF-8, not \u escapes
    encoded.clear()
    messages.append({"role": "assistant", "content": None, "tool_calls": []})
    assert json.loads(bodies.body(model="m", messages=messages, tools=tools)) == json.loads(sdk(messages))
    assert encoded == [messages[-1]]  # only the new message
    messages[0] = {"role": "system", "content": "replaced"}  # another object at a known place is encoded again
    assert json.loads(bodies.body(model="m", messages=messages[:2], tools=tools)) == json.loads(sdk(messages[:2]))
