"""A deterministic OpenAI-compatible chat server that plays scripts written in the user message.

It exists so the whole product, and its tests, run offline through the real openai SDK code path.
Standard library only and no Django import: it also runs as `python -m scripted_model`.

Script lines (found in the latest user message, one model response per line):
    tool <name> <json object>     one tool call
    parallel / tool ... / end     several tool calls in one response
    say <text>                    the final answer; `{results}` expands to this turn's tool results
    sleep <ms>                    delay the next response
    error <http status>           fail the next response once; a retry of the same position succeeds
The script position is the number of assistant messages after the latest user message, so the
model advances one line each time the product has fed back the tool results of the previous one.
Without script lines it plays the built-in incident-investigation demo (see DEMO_STARTER_FILES).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

DEFAULT_PORT = 8765
MODEL_ID = "scripted"
SCRIPT_FINISHED_TEXT = "(script finished)"
RESULT_PREVIEW_CHARS = 200
MAX_BODY_BYTES = 32 * 1024 * 1024
# Enough for a long test run; bounded so a server left running for weeks does not grow forever.
MAX_ERROR_RECORDS = 10_000

DEMO_STARTER_FILES: dict[str, str] = {
    "logs/service.log": """\
2025-03-14T09:58:02Z INFO  api            request_id=7f1c POST /v1/charges 201 112ms
2025-03-14T09:58:40Z INFO  payments-worker consumed job=charge.capture id=88213 in 340ms
2025-03-14T09:59:11Z WARN  payments-worker rss=1.71GiB approaching memory limit 2GiB
2025-03-14T09:59:37Z WARN  payments-worker rss=1.94GiB batch=settlement-2025-03-14 rows=48211
2025-03-14T09:59:52Z ERROR payments-worker OOMKilled (exit 137) while loading settlement batch
2025-03-14T09:59:53Z INFO  supervisor     payments-worker restarted (restart_count=1)
2025-03-14T10:00:31Z WARN  payments-worker rss=1.97GiB batch=settlement-2025-03-14 rows=48211
2025-03-14T10:00:44Z ERROR payments-worker OOMKilled (exit 137) while loading settlement batch
2025-03-14T10:00:45Z INFO  supervisor     payments-worker restarted (restart_count=2)
2025-03-14T10:00:52Z WARN  api            request_id=91ab POST /v1/charges 202 queued (queue_depth=412)
2025-03-14T10:01:20Z ERROR payments-worker OOMKilled (exit 137) while loading settlement batch
2025-03-14T10:01:21Z INFO  supervisor     payments-worker restarted (restart_count=3)
2025-03-14T10:01:22Z WARN  supervisor     payments-worker backoff 30s (crash loop detected)
2025-03-14T10:01:40Z WARN  api            request_id=a03e POST /v1/charges 202 queued (queue_depth=1290)
2025-03-14T10:01:58Z ERROR alerts         PaymentsQueueBacklog firing: queue_depth=1804 > 1000 for 60s
2025-03-14T10:02:03Z INFO  deploy         config change: SETTLEMENT_BATCH_SIZE 5000 -> 50000 (rev 4c2e91a)
2025-03-14T10:02:10Z ERROR payments-worker OOMKilled (exit 137) while loading settlement batch
2025-03-14T10:02:11Z INFO  supervisor     payments-worker restarted (restart_count=4)
2025-03-14T10:02:12Z WARN  supervisor     payments-worker backoff 60s (crash loop detected)
2025-03-14T10:02:30Z ERROR api            request_id=c77d POST /v1/charges 503 payments backlog full
""",
}

DEMO_RESTART_COMMAND = (
    'echo "restarting payments-worker with SETTLEMENT_BATCH_SIZE=5000" && mkdir -p state && '
    'date -u +"restarted_at=%Y-%m-%dT%H:%M:%SZ" > state/payments-worker.restarted && '
    'echo "payments-worker restarted"'
)

DEMO_REPORT = (
    "## Incident report: payments-worker crash loop\n\n"
    "**What happened:** the payments worker was OOM-killed (exit 137) four times while loading the "
    "settlement batch, and the supervisor put it into a crash-loop backoff. The payments queue backed up "
    "past 1,800 jobs and the API started answering 503.\n\n"
    "**Likely cause:** a config change raised SETTLEMENT_BATCH_SIZE from 5000 to 50000, so one batch "
    "no longer fits in the worker's 2 GiB memory limit.\n\n"
    "**Action:** I asked to restart the worker with the smaller batch size (that command needed a "
    "reviewer's approval) and then checked the restart marker. The tool results below show what "
    "actually happened.\n\n"
    "**Follow-up:** revert rev 4c2e91a and add a memory alert below the limit.\n\n"
    "Tool results this turn:\n{results}"
)

_ERROR_KINDS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", "permission_denied"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("timeout_error", "timeout"),
    409: ("invalid_request_error", "conflict"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "unprocessable_entity"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", "internal_error"),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "overloaded"),
    504: ("server_error", "timeout"),
}

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_KEYWORDS = frozenset({"tool", "parallel", "end", "say", "sleep", "error"})


class ScriptError(ValueError):
    """A line that starts with a script keyword but cannot be played."""


class RequestError(ValueError):
    """The request itself is malformed; rendered as an OpenAI-style error body."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as the API carries it
    call_id: str = ""


@dataclass(frozen=True)
class ScriptStep:
    """One model response: tool calls or a final text, plus the modifiers written before it."""

    line_index: int
    tool_calls: tuple[ToolCall, ...] = ()
    text: str | None = None
    sleep_ms: int = 0
    error_status: int | None = None


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
    # Identifies "this conversation at this script line": an `error` fires once per key.
    position_key: str = ""
    response_id: str = ""


# ---------------------------------------------------------------- the script


def _parse_line(line: str, line_index: int) -> tuple[str, Any] | None:
    """Return (keyword, value) for a script line, None for prose; raise ScriptError for a broken one."""
    keyword, _, rest = line.partition(" ")
    if keyword not in _KEYWORDS:
        return None
    rest = rest.strip()
    where = f"line {line_index + 1}"
    if keyword in ("parallel", "end"):
        if rest:
            raise ScriptError(f"{where}: `{keyword}` takes no argument")
        return keyword, None
    if keyword == "say":
        return keyword, rest
    if keyword in ("sleep", "error"):
        if not rest.isdigit():
            raise ScriptError(f"{where}: `{keyword}` needs a whole number, got {rest!r}")
        number = int(rest)
        if keyword == "error" and not 400 <= number <= 599:
            raise ScriptError(f"{where}: `error` needs an HTTP status 400-599, got {number}")
        return keyword, number
    name, _, raw_arguments = rest.partition(" ")
    if not name:
        raise ScriptError(f"{where}: `tool` needs a name")
    raw_arguments = raw_arguments.strip() or "{}"
    try:
        arguments = json.loads(raw_arguments)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"{where}: tool arguments are not valid JSON ({exc.msg})") from exc
    if not isinstance(arguments, dict):
        raise ScriptError(f"{where}: tool arguments must be a JSON object")
    return keyword, ToolCall(name=name, arguments=json.dumps(arguments))


def parse_script(text: str) -> list[ScriptStep] | None:
    """Parse a user message into response steps; None when it holds no script lines (plain prose).

    A keyword line that cannot be parsed raises ScriptError only when the message is a script
    (has at least one valid line): a sentence such as "error 5 times today" must not break the demo.
    """
    parsed: list[tuple[int, str, Any]] = []
    broken: list[ScriptError] = []
    for index, raw in enumerate(text.splitlines()):
        try:
            item = _parse_line(raw.strip(), index)
        except ScriptError as exc:
            broken.append(exc)
            continue
        if item is not None:
            parsed.append((index, *item))
    if not parsed:
        return None
    if broken:
        raise broken[0]

    steps: list[ScriptStep] = []
    sleep_ms, error_status = 0, None
    group: list[ToolCall] | None = None
    group_index = 0
    for index, keyword, value in parsed:
        where = f"line {index + 1}"
        if group is not None and keyword not in ("tool", "end"):
            raise ScriptError(f"{where}: only `tool` lines may appear between `parallel` and `end`")
        if keyword == "sleep":
            sleep_ms += value
        elif keyword == "error":
            error_status = value
        elif keyword == "parallel":
            group, group_index = [], index
        elif keyword == "end":
            if group is None:
                raise ScriptError(f"{where}: `end` without `parallel`")
            if not group:
                raise ScriptError(f"{where}: empty `parallel` block")
            steps.append(ScriptStep(group_index, tuple(group), None, sleep_ms, error_status))
            group, sleep_ms, error_status = None, 0, None
        elif keyword == "tool" and group is not None:
            group.append(value)
        else:
            calls = (value,) if keyword == "tool" else ()
            text_value = value if keyword == "say" else None
            steps.append(ScriptStep(index, calls, text_value, sleep_ms, error_status))
            sleep_ms, error_status = 0, None
    if group is not None:
        raise ScriptError(f"line {group_index + 1}: `parallel` without `end`")
    # Modifiers after the last response line apply to the "(script finished)" answer.
    if sleep_ms or error_status is not None:
        steps.append(ScriptStep(len(text.splitlines()), (), None, sleep_ms, error_status))
    return steps


def _demo_steps() -> list[ScriptStep]:
    def call(index: int, name: str, arguments: dict[str, Any]) -> ScriptStep:
        return ScriptStep(index, (ToolCall(name=name, arguments=json.dumps(arguments)),))

    return [
        call(0, "list_files", {"path": "."}),
        call(1, "read_file", {"path": "logs/service.log"}),
        call(2, "run_command", {"command": DEMO_RESTART_COMMAND}),
        call(3, "read_file", {"path": "state/payments-worker.restarted"}),
        ScriptStep(4, (), DEMO_REPORT),
    ]


# ---------------------------------------------------------------- reading the conversation


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
    script_text = content_text(messages[latest_user].get("content")) if latest_user >= 0 else ""
    position = sum(1 for m in messages[latest_user + 1 :] if m.get("role") == "assistant")
    digest = conversation_hash(messages)
    prompt_chars = sum(
        len(text) + sum(len(name) + len(arguments) for _, name, arguments in calls) + len(str(role))
        for role, text, calls, _ in _normalized(messages)
    )

    try:
        parsed = parse_script(script_text)
        steps = parsed if parsed is not None else _demo_steps()
    except ScriptError as exc:
        # Surfaced as the answer (not a 400) so a test author sees the typo in the turn output.
        steps = [ScriptStep(0, (), f"(script error: {exc})")]
        position = 0

    step = steps[position] if position < len(steps) else ScriptStep(len(steps), (), SCRIPT_FINISHED_TEXT)
    if not step.tool_calls and step.text is None:
        step = ScriptStep(step.line_index, (), SCRIPT_FINISHED_TEXT, step.sleep_ms, step.error_status)

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


# ---------------------------------------------------------------- the request


def validate_request(body: Any) -> dict[str, Any]:
    """Check the fields the server relies on; raise RequestError (400) like the real API does."""
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("You must provide a model parameter.", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array.", param="messages")
    for index, message in enumerate(messages):
        param = f"messages.[{index}]"
        if not isinstance(message, dict):
            raise RequestError(f"{param} must be an object.", param=param)
        if message.get("role") not in _ROLES:
            raise RequestError(f"{param}.role must be one of {sorted(_ROLES)}.", param=f"{param}.role")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise RequestError(f"{param}.content must be a string or an array.", param=f"{param}.content")
        if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise RequestError(f"{param}.tool_call_id is required for tool messages.", param=f"{param}.tool_call_id")
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and (
            not isinstance(tool_calls, list)
            or not all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in tool_calls)
        ):
            raise RequestError(f"{param}.tool_calls must be an array of function calls.", param=f"{param}.tool_calls")
    tools = body.get("tools")
    if tools is not None and (
        not isinstance(tools, list)
        or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
            for t in tools
        )
    ):
        raise RequestError("'tools' must be an array of {type: function, function: {name, ...}}.", param="tools")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise RequestError("'stream' must be a boolean.", param="stream")
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not isinstance(stream_options, dict):
            raise RequestError("'stream_options' must be an object.", param="stream_options")
        if not stream:
            raise RequestError(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
            )
    return body


def error_body(status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
    kind, code = _ERROR_KINDS.get(status, ("server_error" if status >= 500 else "invalid_request_error", str(status)))
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def completion_body(reply: Reply, model: str, created: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return {
        "id": reply.response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": "scripted",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}],
        "usage": _usage(reply),
    }


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def _text_pieces(text: str, words_per_piece: int = 3) -> list[str]:
    tokens = re.findall(r"\s*\S+\s*|\s+", text)
    return ["".join(tokens[i : i + words_per_piece]) for i in range(0, len(tokens), words_per_piece)] or [""]


def stream_chunks(reply: Reply, model: str, created: int, *, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk` objects of one streamed answer, in the order the real API sends them."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": reply.response_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "scripted",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if include_usage:
            body["usage"] = None
        return body

    yield chunk({"role": "assistant", "content": "" if reply.text is not None else None, "refusal": None})
    if reply.text is not None:
        for piece in _text_pieces(reply.text):
            yield chunk({"content": piece})
    for index, call in enumerate(reply.tool_calls):
        header = {
            "index": index,
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        yield chunk({"tool_calls": [header]})
        # Arguments arrive in fragments, as they do from real models, so clients must concatenate.
        middle = len(call.arguments) // 2
        for fragment in (call.arguments[:middle], call.arguments[middle:]):
            if fragment:
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
    yield chunk({}, reply.finish_reason)
    if include_usage:
        final = chunk({})
        final["choices"] = []
        final["usage"] = _usage(reply)
        yield final


# ---------------------------------------------------------------- the HTTP server


class ScriptedModelServer(ThreadingHTTPServer):
    """Threaded so a slow (`sleep`) or streaming answer never blocks other sessions' calls."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], *, api_key: str | None = None, log_requests: bool = False) -> None:
        super().__init__(address, ScriptedModelHandler)
        self.api_key = api_key or None
        self.log_requests = log_requests
        self.ledger = ErrorLedger()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/v1"


class ScriptedModelHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps the SDK's pooled connections alive; every response therefore carries a
    # Content-Length or is sent chunked.
    protocol_version = "HTTP/1.1"
    server_version = "agentops-scripted-model/1"
    server: ScriptedModelServer

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.log_requests:
            super().log_message(format, *args)

    # ---- routing

    def do_GET(self) -> None:
        path = self._path()
        if not self._authorized():
            return
        if path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [_model_card(MODEL_ID)]})
        elif path.startswith("/v1/models/"):
            self._send_json(200, _model_card(path.removeprefix("/v1/models/")))
        elif path == "/v1/chat/completions":
            self._send_error(405, "Use POST for /v1/chat/completions.")
        else:
            self._send_error(404, f"Unknown path {path}.")

    def do_POST(self) -> None:
        path = self._path()
        raw = self._read_body()
        if raw is None or not self._authorized():
            return
        if path != "/v1/chat/completions":
            self._send_error(404 if path != "/v1/models" else 405, f"Unknown path {path}.")
            return
        try:
            try:
                decoded = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise RequestError(f"The request body is not valid JSON: {exc}") from exc
            body = validate_request(decoded)
        except RequestError as exc:
            self._send_error(exc.status, exc.message, param=exc.param)
            return
        self._answer(body)

    def _answer(self, body: dict[str, Any]) -> None:
        reply = plan_reply(body["messages"])
        if reply.sleep_ms:
            time.sleep(reply.sleep_ms / 1000)
        if reply.error_status is not None and self.server.ledger.first_time(reply.position_key):
            self._send_error(reply.error_status, f"Scripted failure (HTTP {reply.error_status}); a retry succeeds.")
            return
        model, created = body["model"], int(time.time())
        if not body.get("stream"):
            self._send_json(200, completion_body(reply, model, created))
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self._send_stream(stream_chunks(reply, model, created, include_usage=include_usage))

    # ---- plumbing

    def _path(self) -> str:
        path = self.path.split("?", 1)[0]
        return path.rstrip("/") or "/"

    def _read_body(self) -> bytes | None:
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            # Without a length the rest of the stream cannot be framed: answer and drop the connection.
            self.close_connection = True
            self._send_error(
                400 if self.headers.get("Transfer-Encoding") is None else 411, "A Content-Length header is required."
            )
            return None
        length = int(length_header)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._send_error(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.")
            return None
        return self.rfile.read(length)

    def _authorized(self) -> bool:
        expected = self.server.api_key
        if expected is None:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() == "bearer" and key.strip() == expected:
            return True
        self._send_error(401, "Incorrect API key provided.")
        return False

    def _send_error(self, status: int, message: str, *, param: str | None = None) -> None:
        headers = {}
        if status == 429 or status >= 500:
            # Lets an SDK with retries enabled come back quickly instead of backing off for seconds.
            headers["retry-after-ms"] = "50"
        self._send_json(status, error_body(status, message, param=param), headers)

    def _send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status, _reason(status))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send_stream(self, chunks: Iterator[dict[str, Any]]) -> None:
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for item in chunks:
                self._write_chunk(f"data: {json.dumps(item)}\n\n".encode())
            self._write_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # The client went away mid-stream (cancelled turn, timeout): nothing to clean up.
            self.close_connection = True

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        # Flushed per event so a consumer sees each delta as it is produced.
        self.wfile.flush()


def _model_card(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "agentops"}


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Scripted Error"


# ---------------------------------------------------------------- entry points


def make_server(
    host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, api_key: str | None = None, log_requests: bool = False
) -> ScriptedModelServer:
    """Bind the server (port 0 picks a free port) without serving yet."""
    return ScriptedModelServer((host, port), api_key=api_key, log_requests=log_requests)


def serve(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    api_key: str | None = None,
    *,
    on_ready: Callable[[str], None] | None = None,
    log_requests: bool = True,
) -> None:
    """Serve until interrupted. `on_ready` gets the base URL once the port is bound (default: print it)."""
    server = make_server(host, port, api_key=api_key, log_requests=log_requests)
    announce = on_ready or (lambda url: print(f"scripted model listening on {url}", flush=True))
    announce(server.base_url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def start_in_thread(
    port: int = 0, *, host: str = "127.0.0.1", api_key: str | None = None
) -> tuple[ScriptedModelServer, str]:
    """Start a server on a background thread for tests; stop it with `server.shutdown()` and
    `server.server_close()`. Returns the server and its base URL (`http://127.0.0.1:N/v1`)."""
    server = make_server(host, port, api_key=api_key)
    thread = threading.Thread(target=server.serve_forever, name="scripted-model", daemon=True)
    thread.start()
    return server, server.base_url


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Deterministic OpenAI-compatible scripted model server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("SCRIPTED_MODEL_API_KEY") or None,
        help="reject other bearer keys with 401 (default: $SCRIPTED_MODEL_API_KEY; unset = any key)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not log each request")
    options = parser.parse_args(argv)
    serve(options.host, options.port, options.api_key, log_requests=not options.quiet)


if __name__ == "__main__":
    main()
