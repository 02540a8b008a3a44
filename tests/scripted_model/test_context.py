"""The scripted model's context window and its answers to agentops's compaction prompt, over HTTP
through the openai SDK."""

import json
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from scripted_model.planner import COMPACTION_MARKER, prompt_tokens
from scripted_model.server import ScriptedModelServer, start_in_thread
from tests.scripted_model.chat import ask, assistant_turn, tool_result

WINDOW = 500


@pytest.fixture(scope="module")
def windowed() -> Iterator[ScriptedModelServer]:
    server, _ = start_in_thread(context_window=WINDOW)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def small(windowed: ScriptedModelServer) -> OpenAI:
    return OpenAI(base_url=windowed.base_url, api_key="x", max_retries=0, timeout=10)


def test_context_window_refuses_a_prompt_over_it_with_openais_error_shape(
        windowed: ScriptedModelServer, small: OpenAI) -> None:
    after = windowed.request_log.last_seq
    fits = [{"role": "user", "content": "say ok\n" + "a" * (WINDOW * 4 - 40)}]
    over = [{"role": "user", "content": "say ok\n" + "a" * (WINDOW * 4 + 40)}]
    assert prompt_tokens(fits) <= WINDOW < prompt_tokens(over)
    assert ask(small, fits).choices[0].message.content == "ok"
    with pytest.raises(openai.BadRequestError) as refused:
        ask(small, over)
    assert refused.value.status_code == 400
    assert refused.value.code == "context_length_exceeded"
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error" and body["param"] == "messages"
    assert f"maximum context length is {WINDOW} tokens" in body["message"]
    logged = windowed.logged_requests(after=after)
    assert [(e.status, e.kind, e.prompt_tokens) for e in logged] == [
        (200, "text", prompt_tokens(fits)), (400, "error", prompt_tokens(over))]


def test_context_usage_reports_the_documented_estimate(windowed: ScriptedModelServer, small: OpenAI) -> None:
    messages = [{"role": "system", "content": "s" * 100}, {"role": "user", "content": "say hi"}]
    answer = ask(small, messages)
    assert answer.usage is not None
    # characters / 4: roles, text, tool-call names and arguments
    assert answer.usage.prompt_tokens == (len("system") + 100 + len("user") + len("say hi")) // 4


def _compaction_request(previous: dict[str, object], transcript: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"{COMPACTION_MARKER} Summarise."},
            {"role": "user", "content": f"Previous summary:\n{json.dumps(previous)}\n\nTranscript to fold in:\n"
                                        + transcript}]


def test_compaction_prompt_gets_a_deterministic_structured_summary(
        windowed: ScriptedModelServer, small: OpenAI) -> None:
    after = windowed.request_log.last_seq
    transcript = "\n\n".join([
        "### user (turn 1)\nFix the flaky test\nmore words",
        '### assistant\ncalls read_file({"path": "tests/test_a.py"}) [c1]',
        "### tool read_file [c1]\ndef test_a(): assert 1",
        '### assistant\ncalls run_command({"command": "pytest"}) [c2]',
        "### tool run_command [c2]\n[exit code 1] 1 failed"])
    messages = _compaction_request({}, transcript)
    first, again = ask(small, messages), ask(small, messages)
    assert first.choices[0].message.content == again.choices[0].message.content
    summary = json.loads(first.choices[0].message.content or "")
    assert summary["goal"] == "Fix the flaky test"
    assert summary["files"] == ["tests/test_a.py"]
    assert summary["facts"] == ["read_file: def test_a(): assert 1"]
    assert summary["tried_and_failed"] == ["run_command: [exit code 1] 1 failed"]
    assert summary["script_position"] == 2  # two answered lines of the turn being played
    assert {e.purpose for e in windowed.logged_requests(after=after)} == {"compaction"}
    # The next compaction folds it in: no user section, so the position adds up.
    more = "### assistant\ncalls list_files({}) [c3]\n\n### tool list_files [c3]\nok"
    later = ask(small, _compaction_request(summary, more))
    folded = json.loads(later.choices[0].message.content or "")
    assert folded["script_position"] == 3 and folded["goal"] == "Fix the flaky test"
    assert folded["facts"] == ["read_file: def test_a(): assert 1", "list_files: ok"]


def test_compaction_summary_position_carries_the_script_on(small: OpenAI) -> None:
    """After a compaction the product sends: system, the turn's input, the summary, recent steps.
    The summary's script_position counts the lines the folded-away replies answered."""
    script = "tool list_files {}\ntool list_files {}\ntool list_files {}\nsay done"
    summary = {"goal": "g", "script_position": 2}
    messages = [{"role": "system", "content": "pinned"}, {"role": "user", "content": script},
                {"role": "system", "content": "Summary:\n" + json.dumps(summary)}]
    third = ask(small, messages).choices[0].message
    assert third.tool_calls and third.tool_calls[0].function.name == "list_files"
    messages += [assistant_turn(third), tool_result(third.tool_calls[0].id, "x")]
    assert ask(small, messages).choices[0].message.content == "done"


def test_verification_prompt_gets_deterministic_verdicts(windowed: ScriptedModelServer, small: OpenAI) -> None:
    from scripted_model.planner import VERIFICATION_MARKER

    messages = [{"role": "system", "content": f"{VERIFICATION_MARKER} Judge."},
                {"role": "user", "content": "Acceptance criteria:\n1. Names the `alpha` release.\n2. Is polite\n\n"
                                            "The turn's result:\nWe shipped ALPHA."}]
    after = windowed.request_log.last_seq
    answer = json.loads(ask(small, messages).choices[0].message.content or "")
    assert answer == {"verdicts": [
        {"criterion": "Names the `alpha` release.", "met": True, "evidence": "'alpha' appears in the result"},
        {"criterion": "Is polite", "met": False, "evidence": "'Is polite' does not appear in the result"}]}
    assert [e.purpose for e in windowed.logged_requests(after=after)] == ["verification"]


def test_prohibitions_prompt_gets_deterministic_checks(small: OpenAI) -> None:
    from scripted_model.planner import PROHIBITIONS_MARKER

    messages = [{"role": "system", "content": f"{PROHIBITIONS_MARKER} Check."},
                {"role": "user", "content": "Prohibitions:\n1. Never touch `prod.db`.\n\nProposed calls:\n"
                                            '- c1: write_file({"path": "prod.db"})\n- c2: list_files({})'}]
    answer = json.loads(ask(small, messages).choices[0].message.content or "")
    assert [(c["call_id"], c["violated"]) for c in answer["checks"]] == [("c1", True), ("c2", False)]
