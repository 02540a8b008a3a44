"""Reading the conversation and planning the reply; the ledger that makes an `error` fire once.

`plan_reply` is pure: the same messages give the same reply, so a retried request (or a history
rebuilt from the database) gets the same tool call ids. How the script position advances is in
the package docstring.
"""

import hashlib
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from scripted_model.demo_mcp import demo_for
from scripted_model.scenarios_airline import airline_steps
from scripted_model.script import ScriptError, ScriptStep, ToolCall, parse_script

SCRIPT_FINISHED_TEXT = "(script finished)"
# What agentops puts in the system message of its compaction and verification calls.
COMPACTION_MARKER = "[[agentops:compaction]]"
VERIFICATION_MARKER = "[[agentops:verification]]"
PROHIBITIONS_MARKER = "[[agentops:prohibitions]]"
CHARS_PER_TOKEN = 4
SUMMARY_FACTS = 20
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
    return max(1, chars // CHARS_PER_TOKEN)


def prompt_chars(messages: list[dict[str, Any]]) -> int:
    """The characters the token estimate counts: per message its role, text, tool-call names and arguments."""
    return sum(
        len(text) + sum(len(name) + len(arguments) for _, name, arguments in calls) + len(str(role))
        for role, text, calls, _ in _normalized(messages)
    )


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """The documented estimate, characters / 4 (agentops estimates the same way): reported as
    `usage.prompt_tokens` and checked against `--context-window`."""
    return _estimate_tokens(prompt_chars(messages))


def request_purpose(messages: list[dict[str, Any]]) -> str:
    """"compaction", "verification" or "prohibitions" when a system message carries agentops's
    marker; else "chat"."""
    for message in messages:
        if message.get("role") == "system":
            text = content_text(message.get("content"))
            if COMPACTION_MARKER in text:
                return "compaction"
            if VERIFICATION_MARKER in text:
                return "verification"
            if PROHIBITIONS_MARKER in text:
                return "prohibitions"
    return "chat"


def system_text(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        if message.get("role") == "system":
            return content_text(message.get("content"))
    return ""


def _json_object(text: str) -> dict[str, Any]:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return {}
    try:
        value = json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _summary_position(messages: list[dict[str, Any]], latest_user: int) -> int:
    """Script lines already answered that a compaction folded away: the `script_position` of a
    summary (a system message after the latest user message, as agentops places it then)."""
    for message in messages[latest_user + 1 :]:
        if message.get("role") == "system":
            position = _json_object(content_text(message.get("content"))).get("script_position")
            if isinstance(position, int):
                return position
    return 0


def _sections(transcript: str) -> list[tuple[str, str]]:
    """(header, body) of each `### ` section of a compaction transcript."""
    sections: list[tuple[str, str]] = []
    for line in transcript.splitlines():
        if line.startswith("### "):
            sections.append((line[4:], ""))
        elif sections:
            header, body = sections[-1]
            sections[-1] = (header, f"{body}\n{line}" if body else line)
    return sections


def compaction_summary(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The deterministic summary of a compaction request: the previous summary with the
    transcript folded in. `script_position` counts the answered lines of the turn being played
    (assistant sections after the last user section, else added to the previous count)."""
    user = next((content_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
    head, _, transcript = user.partition("Transcript to fold in:")
    previous = _json_object(head)
    sections = _sections(transcript)
    users = [i for i, (header, _) in enumerate(sections) if header.startswith("user")]
    answered = sum(1 for header, _ in sections[users[-1] + 1 if users else 0 :] if header == "assistant")
    facts = list(previous.get("facts") or [])
    failed = list(previous.get("tried_and_failed") or [])
    files = list(previous.get("files") or [])
    for header, body in sections:
        if header.startswith("tool "):
            name = header.split()[1]
            line = f"{name}: {' '.join(body.split())[:80]}"
            (failed if body.startswith(("[error", "[exit code")) else facts).append(line)
        elif header == "assistant":
            for path in re.findall(r'"path": "([^"]+)"', body):
                if path not in files:
                    files.append(path)
    goal = sections[users[-1]][1].splitlines()[0][:200] if users and sections[users[-1]][1] else ""
    return {
        "goal": goal or previous.get("goal", ""),
        "decisions": list(previous.get("decisions") or [])[-SUMMARY_FACTS:],
        "facts": facts[-SUMMARY_FACTS:],
        "files": files[-SUMMARY_FACTS:],
        "open_questions": [],
        "tried_and_failed": failed[-SUMMARY_FACTS:],
        "script_position": answered if users else int(previous.get("script_position") or 0) + answered,
        "compacted_sections": int(previous.get("compacted_sections") or 0) + len(sections),
    }


def verification_verdicts(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The deterministic verdicts of a verification request: a criterion is met when its key (the
    text between backticks in it, else the whole criterion) occurs in the result, ignoring case."""
    user = next((content_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
    head, _, result = user.partition("The turn's result:")
    lines = [line.strip() for line in head.partition("Acceptance criteria:")[2].splitlines()]
    criteria = [re.sub(r"^\d+\.\s*", "", line) for line in lines if re.match(r"^\d+\.", line)]
    verdicts = []
    for criterion in criteria:
        quoted = re.findall(r"`([^`]+)`", criterion)
        key = quoted[0] if quoted else criterion
        met = key.lower() in result.lower()
        evidence = f"{key!r} {'appears' if met else 'does not appear'} in the result"
        verdicts.append({"criterion": criterion, "met": met, "evidence": evidence})
    return {"verdicts": verdicts}


def prohibition_checks(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The deterministic checks of a prohibitions request: a call violates a prohibition when its
    key (the text between backticks in it, else the whole prohibition) occurs in the call's name or
    arguments, ignoring case."""
    user = next((content_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
    head, _, proposed = user.partition("Proposed calls:")
    lines = [line.strip() for line in head.partition("Prohibitions:")[2].splitlines()]
    prohibitions = [re.sub(r"^\d+\.\s*", "", line) for line in lines if re.match(r"^\d+\.", line)]
    checks = []
    for line in proposed.splitlines():
        match = re.match(r"^- ([^:]+): (.*)$", line.strip())
        if not match:
            continue
        call_id, call = match.groups()
        for prohibition in prohibitions:
            quoted = re.findall(r"`([^`]+)`", prohibition)
            key = quoted[0] if quoted else prohibition
            violated = key.lower() in call.lower()
            checks.append({"call_id": call_id, "prohibition": prohibition, "violated": violated,
                           "evidence": f"{key!r} {'appears' if violated else 'does not appear'} in the call"})
    return {"checks": checks}


def plan_reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Reply:
    """Decide the model's answer to a conversation. Pure: the same messages give the same reply."""
    latest_user = _latest_user_index(messages)
    script_text = latest_user_text(messages)
    digest = conversation_hash(messages)
    chars = prompt_chars(messages)
    purpose = request_purpose(messages)
    if purpose != "chat":
        answers = {"compaction": compaction_summary, "verification": verification_verdicts,
                   "prohibitions": prohibition_checks}
        answer = answers[purpose](messages)
        text = json.dumps(answer, sort_keys=True)
        return Reply(text=text, tool_calls=(), finish_reason="stop", prompt_tokens=_estimate_tokens(chars),
                     completion_tokens=_estimate_tokens(len(text)), position_key=f"{digest}:{purpose}",
                     response_id=f"chatcmpl-{digest[:24]}")
    position = sum(1 for m in messages[latest_user + 1 :] if m.get("role") == "assistant")
    position += _summary_position(messages, latest_user)

    try:
        parsed = parse_script(script_text)
        steps = parsed if parsed is not None else (airline_steps(script_text) or demo_for(tools))
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
            prompt_tokens=_estimate_tokens(chars),
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
        prompt_tokens=_estimate_tokens(chars),
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
