"""The script language, played through the real openai SDK: tool calls, say, sleep, error, the demo."""

import json
import time
from typing import Any

import openai
import pytest
from openai import OpenAI

from scripted_model.demo import DEMO_RESTART_COMMAND, DEMO_STARTER_FILES
from scripted_model.planner import SCRIPT_FINISHED_TEXT
from tests.scripted_model.chat import ask, assistant_turn, tool_result


def test_scripted_model_single_tool_call(client: OpenAI) -> None:
    response = ask(client, [{"role": "user", "content": 'tool read_file {"path": "a.txt"}\nsay done'}])

    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "read_file"
    assert json.loads(call.function.arguments) == {"path": "a.txt"}
    assert call.id.startswith("call_0_0_")
    assert response.usage is not None and response.usage.prompt_tokens >= 1 and response.usage.completion_tokens >= 1
    # Deterministic: the same conversation yields the same call id (a retried model call is harmless).
    again = ask(client, [{"role": "user", "content": 'tool read_file {"path": "a.txt"}\nsay done'}])
    assert again.choices[0].message.tool_calls[0].id == call.id


def test_scripted_model_parallel_tool_calls(client: OpenAI) -> None:
    script = 'Please do this:\nparallel\ntool list_files {"path": "."}\ntool read_file {"path": "b"}\nend\nsay ok'

    response = ask(client, [{"role": "user", "content": script}])

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
        tool_result("old", "from an earlier turn"),
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": 'tool run_command {"command": "rm -rf /"}\nsay Told: {results}'},
    ]
    first = ask(client, messages)
    call = first.choices[0].message.tool_calls[0]
    messages += [assistant_turn(first.choices[0].message), tool_result(call.id, "rejected by reviewer: " + "x" * 300)]

    final = ask(client, messages)

    assert final.choices[0].finish_reason == "stop"
    text = final.choices[0].message.content
    assert text == "Told: run_command: rejected by reviewer: " + "x" * (200 - len("rejected by reviewer: "))
    assert "earlier turn" not in text
    messages.append(assistant_turn(final.choices[0].message))
    assert ask(client, messages).choices[0].message.content == SCRIPT_FINISHED_TEXT


def test_scripted_model_sleep_delays_the_next_answer(client: OpenAI) -> None:
    started = time.monotonic()
    response = ask(client, [{"role": "user", "content": "sleep 300\nsay slow"}])
    elapsed = time.monotonic() - started

    assert response.choices[0].message.content == "slow"
    assert elapsed >= 0.3


def test_scripted_model_error_fails_once_then_retry_succeeds(client: OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "error 500\nsay recovered"}]

    with pytest.raises(openai.InternalServerError) as failure:
        ask(client, messages)
    retried = ask(client, messages)

    assert failure.value.status_code == 500
    assert failure.value.body == {
        "message": "Scripted failure (HTTP 500); a retry succeeds.",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
    assert retried.choices[0].message.content == "recovered"


def test_scripted_model_script_typo_is_reported_in_the_answer(client: OpenAI) -> None:
    response = ask(client, [{"role": "user", "content": "tool read_file {path: 1}\nsay done"}])

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
        response = ask(client, messages)
        [call] = response.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == (name, arguments)
        messages += [assistant_turn(response.choices[0].message), tool_result(call.id, result)]
    report = ask(client, messages).choices[0]

    assert report.finish_reason == "stop"
    assert "Incident report" in report.message.content
    assert "run_command: payments-worker restarted" in report.message.content
    assert "read_file: restarted_at=2025" in report.message.content
    assert "OOMKilled" in DEMO_STARTER_FILES["logs/service.log"]
    assert "state/payments-worker.restarted" in DEMO_RESTART_COMMAND
