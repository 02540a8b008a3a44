"""The scripted model, driven over HTTP through the real openai SDK (no database needed)."""

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from scripted_model.server import (
    DEMO_RESTART_COMMAND,
    DEMO_STARTER_FILES,
    SCRIPT_FINISHED_TEXT,
    ScriptedModelServer,
    start_in_thread,
)

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    for name in ("list_files", "read_file", "write_file", "run_command")
]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ScriptedModelServer, str]]:
    server, base_url = start_in_thread()
    yield server, base_url
    server.shutdown()
    server.server_close()


@pytest.fixture
def base_url(server: tuple[ScriptedModelServer, str]) -> str:
    return server[1]


@pytest.fixture
def client(base_url: str) -> OpenAI:
    # No SDK retries: a scripted failure must be observed, not silently retried away.
    return OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10)


def _ask(client: OpenAI, messages: list[Any]) -> Any:
    return client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)


def _assistant_turn(message: Any) -> dict[str, Any]:
    """The assistant message as the product would send it back in the next request."""
    return message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})


def _tool_result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def test_scripted_model_single_tool_call(client: OpenAI) -> None:
    response = _ask(client, [{"role": "user", "content": 'tool read_file {"path": "a.txt"}\nsay done'}])

    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "read_file"
    assert json.loads(call.function.arguments) == {"path": "a.txt"}
    assert call.id.startswith("call_0_0_")
    assert response.usage is not None and response.usage.prompt_tokens >= 1 and response.usage.completion_tokens >= 1
    # Deterministic: the same conversation yields the same call id (a retried model call is harmless).
    again = _ask(client, [{"role": "user", "content": 'tool read_file {"path": "a.txt"}\nsay done'}])
    assert again.choices[0].message.tool_calls[0].id == call.id


def test_scripted_model_parallel_tool_calls(client: OpenAI) -> None:
    script = 'Please do this:\nparallel\ntool list_files {"path": "."}\ntool read_file {"path": "b"}\nend\nsay ok'

    response = _ask(client, [{"role": "user", "content": script}])

    calls = response.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["list_files", "read_file"]
    assert len({c.id for c in calls}) == 2
    assert response.choices[0].finish_reason == "tool_calls"


def test_scripted_model_say_expands_results_of_this_turn(client: OpenAI) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "an earlier turn"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "old", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}],
        },
        _tool_result("old", "from an earlier turn"),
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": 'tool run_command {"command": "rm -rf /"}\nsay Told: {results}'},
    ]
    first = _ask(client, messages)
    call = first.choices[0].message.tool_calls[0]
    messages += [_assistant_turn(first.choices[0].message), _tool_result(call.id, "rejected by reviewer: " + "x" * 300)]

    final = _ask(client, messages)

    assert final.choices[0].finish_reason == "stop"
    text = final.choices[0].message.content
    assert text == "Told: run_command: rejected by reviewer: " + "x" * (200 - len("rejected by reviewer: "))
    assert "earlier turn" not in text
    messages.append(_assistant_turn(final.choices[0].message))
    assert _ask(client, messages).choices[0].message.content == SCRIPT_FINISHED_TEXT


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


def test_scripted_model_sleep_delays_the_next_answer(client: OpenAI) -> None:
    started = time.monotonic()
    response = _ask(client, [{"role": "user", "content": "sleep 300\nsay slow"}])
    elapsed = time.monotonic() - started

    assert response.choices[0].message.content == "slow"
    assert elapsed >= 0.3


def test_scripted_model_serves_requests_concurrently(client: OpenAI) -> None:
    scripts = [f"sleep 400\nsay answer {n}" for n in range(4)]

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda s: _ask(client, [{"role": "user", "content": s}]), scripts))
    elapsed = time.monotonic() - started

    assert [a.choices[0].message.content for a in answers] == [f"answer {n}" for n in range(4)]
    assert elapsed < 1.2  # one sleeping answer must not hold up the others (serial would be 1.6 s)


def test_scripted_model_error_fails_once_then_retry_succeeds(client: OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "error 500\nsay recovered"}]

    with pytest.raises(openai.InternalServerError) as failure:
        _ask(client, messages)
    retried = _ask(client, messages)

    assert failure.value.status_code == 500
    assert failure.value.body == {
        "message": "Scripted failure (HTTP 500); a retry succeeds.",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
    assert retried.choices[0].message.content == "recovered"


def test_scripted_model_rejects_wrong_api_key() -> None:
    server, base_url = start_in_thread(api_key="right")
    try:
        with pytest.raises(openai.AuthenticationError) as failure:
            OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
        models = OpenAI(base_url=base_url, api_key="right", max_retries=0).models.list()
    finally:
        server.shutdown()
        server.server_close()

    assert failure.value.status_code == 401
    assert failure.value.code == "invalid_api_key"
    assert [m.id for m in models.data] == ["scripted"]


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


def test_scripted_model_script_typo_is_reported_in_the_answer(client: OpenAI) -> None:
    response = _ask(client, [{"role": "user", "content": "tool read_file {path: 1}\nsay done"}])

    assert response.choices[0].message.content.startswith("(script error: line 1: ")


def test_scripted_model_plays_demo_without_a_script(client: OpenAI) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "You are an SRE agent."},
        {"role": "user", "content": "The payments service is failing, please investigate."},
    ]
    results = ["logs/", DEMO_STARTER_FILES["logs/service.log"], "payments-worker restarted", "restarted_at=2025"]
    expected = [
        ("list_files", {"path": "."}),
        ("read_file", {"path": "logs/service.log"}),
        ("run_command", {"command": DEMO_RESTART_COMMAND}),
        ("read_file", {"path": "state/payments-worker.restarted"}),
    ]

    for (name, arguments), result in zip(expected, results, strict=True):
        response = _ask(client, messages)
        [call] = response.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == (name, arguments)
        messages += [_assistant_turn(response.choices[0].message), _tool_result(call.id, result)]
    report = _ask(client, messages).choices[0]

    assert report.finish_reason == "stop"
    assert "Incident report" in report.message.content
    assert "run_command: payments-worker restarted" in report.message.content
    assert "read_file: restarted_at=2025" in report.message.content
    assert "OOMKilled" in DEMO_STARTER_FILES["logs/service.log"]
    assert "state/payments-worker.restarted" in DEMO_RESTART_COMMAND
