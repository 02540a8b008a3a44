"""Reading the conversation and planning the reply; the ledger that makes an `error` fire once.

`plan_reply` is pure: the same messages give the same reply, so a retried request (or a history
rebuilt from the database) gets the same tool call ids. How the script position advances is in
the package docstring.
"""

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from scripted_model.demo import demo_steps
from scripted_model.script import ScriptError, ScriptStep, ToolCall, parse_script

SCRIPT_FINISHED_TEXT = "(script finished)"
RESULT_PREVIEW_CHARS = 200
# Enough for a long test run; bounded so a server left running for weeks does not grow forever.
MAX_ERROR_RECORDS = 10_000


@dataclass(frozen=True)
class Reply:
    """What the model answers to one request, before it is rendered as JSON or SSE."""

    text: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: Literal["stop", "tool_calls"]
    prompt_tokens: int
    completion_tokens: int
    sleep_ms: int = 0
    error_status: int | None = None
    retry_after: int | None = None
    # The script position answered (0 for a script that does not parse: its error is the answer).
    position: int = 0
    # Identifies "this conversation at this script line": an `error` fires once per key.
    position_key: str = ""
    response_id: str = ""


def content_text(content: Any) -> str:
    """Flatten message content: a string, or a list of parts of which the text parts count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part.get("text", "") for part in content if isinstance(part, dict)]
        return "\n".join(text for text in texts if isinstance(text, str))
    return str(content)


def _tool_calls_of(message: dict[str, Any]) -> list[tuple[str, str, str]]:
    calls = message.get("tool_calls") or []
    result = []
    for call in calls:
        function = call.get("function") or {}
        result.append((str(call.get("id", "")), str(function.get("name", "")), str(function.get("arguments", ""))))
    return result


def _normalized(messages: list[dict[str, Any]]) -> list[list[Any]]:
    """The parts of each message that matter, so a history rebuilt from the database (with `null`
    fields added or dropped) hashes the same as the original: the `error` ledger depends on it."""
    return [
        [m.get("role"), content_text(m.get("content")), _tool_calls_of(m), m.get("tool_call_id") or ""]
        for m in messages
    ]


def conversation_hash(messages: list[dict[str, Any]]) -> str:
    canonical = json.dumps(_normalized(messages), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _latest_user_index(messages: list[dict[str, Any]]) -> int:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return -1


def latest_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the latest user message: the script being played ("" when there is none)."""
    latest_user = _latest_user_index(messages)
    return content_text(messages[latest_user].get("content")) if latest_user >= 0 else ""


def format_results(messages: list[dict[str, Any]]) -> str:
    """One line per tool result after the latest user message: `<tool name>: <first 200 chars>`.

    Whitespace is collapsed so each result stays on one line even when the tool returned a file."""
    names: dict[str, str] = {}
    for message in messages:
        if message.get("role") == "assistant":
            for call_id, name, _ in _tool_calls_of(message):
                names[call_id] = name
    lines = []
    for message in messages[_latest_user_index(messages) + 1 :]:
        if message.get("role") != "tool":
            continue
        name = names.get(str(message.get("tool_call_id", "")), "unknown_tool")
        preview = " ".join(content_text(message.get("content"))[:RESULT_PREVIEW_CHARS].split())
        lines.append(f"{name}: {preview}")
    return "\n".join(lines)


def _estimate_tokens(chars: int) -> int:
    return max(1, chars // 4)


def plan_reply(messages: list[dict[str, Any]]) -> Reply:
    """Decide the model's answer to a conversation. Pure: the same messages give the same reply."""
    latest_user = _latest_user_index(messages)
    script_text = latest_user_text(messages)
    position = sum(1 for m in messages[latest_user + 1 :] if m.get("role") == "assistant")
    digest = conversation_hash(messages)
    prompt_chars = sum(
        len(text) + sum(len(name) + len(arguments) for _, name, arguments in calls) + len(str(role))
        for role, text, calls, _ in _normalized(messages)
    )

    try:
        parsed = parse_script(script_text)
        steps = parsed if parsed is not None else demo_steps()
    except ScriptError as exc:
        # Surfaced as the answer (not a 400) so a test author sees the typo in the turn output.
        steps = [ScriptStep(0, (), f"(script error: {exc})")]
        position = 0

    step = steps[position] if position < len(steps) else ScriptStep(len(steps), (), SCRIPT_FINISHED_TEXT)
    if not step.tool_calls and step.text is None:
        step = ScriptStep(step.line_index, (), SCRIPT_FINISHED_TEXT, step.sleep_ms, step.error_status,
                          step.retry_after)

    position_key = f"{digest}:{step.line_index}"
    if step.tool_calls:
        calls = tuple(
            ToolCall(
                name=call.name,
                arguments=call.arguments,
                # Deterministic so a retried request yields the same call ids; the conversation
                # digest keeps them distinct between turns that replay the same script.
                call_id=f"call_{step.line_index}_{k}_"
                + hashlib.sha256(f"{digest}:{k}:{call.name}:{call.arguments}".encode()).hexdigest()[:10],
            )
            for k, call in enumerate(step.tool_calls)
        )
        output_chars = sum(len(call.name) + len(call.arguments) for call in calls)
        return Reply(
            text=None,
            tool_calls=calls,
            finish_reason="tool_calls",
            prompt_tokens=_estimate_tokens(prompt_chars),
            completion_tokens=_estimate_tokens(output_chars),
            sleep_ms=step.sleep_ms,
            error_status=step.error_status,
            retry_after=step.retry_after,
            position=position,
            position_key=position_key,
            response_id=f"chatcmpl-{digest[:24]}",
        )
    text = (step.text or "").replace("{results}", format_results(messages))
    return Reply(
        text=text,
        tool_calls=(),
        finish_reason="stop",
        prompt_tokens=_estimate_tokens(prompt_chars),
        completion_tokens=_estimate_tokens(len(text)),
        sleep_ms=step.sleep_ms,
        error_status=step.error_status,
        retry_after=step.retry_after,
        position=position,
        position_key=position_key,
        response_id=f"chatcmpl-{digest[:24]}",
    )


class ErrorLedger:
    """Remembers which (conversation, line) positions already failed, so an `error` fires once."""

    def __init__(self, capacity: int = MAX_ERROR_RECORDS) -> None:
        self._capacity = capacity
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, key: str) -> bool:
        # Concurrent retries of one position must not both fail: check and insert under one lock.
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = None
            if len(self._seen) > self._capacity:
                self._seen.popitem(last=False)
            return True
