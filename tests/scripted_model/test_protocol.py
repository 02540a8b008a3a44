"""The OpenAI wire format: streamed deltas as the SDK assembles them, and OpenAI-style errors."""

import json

import httpx
from openai import OpenAI

from tests.scripted_model.chat import TOOLS


def test_scripted_model_streams_text_deltas_and_usage(client: OpenAI) -> None:
    text = "The quick brown fox jumps over the lazy dog and keeps on running far away."

    stream = client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": f"say {text}"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(deltas) > 2
    assert "".join(deltas) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.completion_tokens == len(text) // 4
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_scripted_model_streams_tool_call_deltas(client: OpenAI) -> None:
    script = 'parallel\ntool write_file {"path": "x.txt", "content": "hello"}\ntool list_files {}\nend'

    stream = client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": script}], tools=TOOLS, stream=True
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        assert chunk.usage is None  # not asked for
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            call["name"] += (delta.function and delta.function.name) or ""
            call["arguments"] += (delta.function and delta.function.arguments) or ""

    assert finish == "tool_calls"
    assert [c["name"] for c in calls.values()] == ["write_file", "list_files"]
    assert json.loads(calls[0]["arguments"]) == {"path": "x.txt", "content": "hello"}
    assert json.loads(calls[1]["arguments"]) == {}
    # A parallel block is one script position: both ids carry the `parallel` line's index.
    assert [c["id"][: len("call_0_0_")] for c in calls.values()] == ["call_0_0_", "call_0_1_"]


def test_scripted_model_rejects_malformed_requests(base_url: str) -> None:
    with httpx.Client(base_url=base_url) as http:
        bad_json = http.post("/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
        no_messages = http.post("/chat/completions", json={"model": "scripted", "messages": []})
        unknown = http.get("/nowhere")

    assert bad_json.status_code == 400
    assert bad_json.json()["error"]["type"] == "invalid_request_error"
    assert set(bad_json.json()["error"]) >= {"message", "type", "code"}
    assert no_messages.status_code == 400
    assert no_messages.json()["error"]["param"] == "messages"
    assert unknown.status_code == 404
