"""The model call through the openai SDK, asynchronously: bounded retries, deltas streamed.

The model gateway (``gateway.py``) awaits these calls on its event loop; nothing here touches the
database: streamed text and retries are reported through the ``EventSink`` the caller passes.

Model calls have no side effects, so they are retried on timeouts, 5xx and connection errors
(bounded, with backoff) and fail at once on authentication and policy errors. A 429 pauses the
whole endpoint for its Retry-After (every call to it waits, not only the one that was refused)
and is retried without counting against the bounded retries, within ``RATE_LIMIT_PATIENCE``.
"""

import asyncio
import itertools
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import openai
from django.conf import settings
from openai.types.chat import ChatCompletion

from sessions_app.models import AgentProfile
from tools_app.selectors import tool_definitions_by_name, tool_names_of_agent

log = logging.getLogger(__name__)

DELTA_INTERVAL_SECONDS = 0.1  # coalesce streamed text: at most ~10 model.delta events a second
RETRY_DELAYS = (0.2, 0.8, 2.0)
MAX_RETRY_AFTER_SECONDS = 60.0
RATE_LIMIT_PATIENCE_SECONDS = 600.0  # how long a call keeps waiting out 429s before it fails (retryable)


def model_lease_seconds() -> float:
    """A model step's lease. The gateway that holds the step renews it while the call runs (its
    retries and rate-limit waits included); one that dies lets it expire within this."""
    return float(settings.AGENTOPS_LEASE_SECONDS)


class ModelCallFailed(Exception):
    def __init__(self, code: str, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.code, self.message, self.retryable = code, message, retryable


# (event type, payload): what a call reports while it runs (model.delta, model.retrying).
EventSink = Callable[[str, dict[str, Any]], Awaitable[None]]


class _Endpoint:
    """The clients of one endpoint and key, used in turn, and the endpoint's rate-limit pause."""

    def __init__(self, base_url: str | None, api_key: str, size: int) -> None:
        # One client per ~(calls in flight / size): one client for everything scans its whole
        # connection pool on every request (O(N) per call at 1,000 streams).
        self.clients = [openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                           timeout=float(settings.AGENTOPS_MODEL_TIMEOUT_SECONDS),
                                           http_client=openai.DefaultAioHttpClient())
                        for _ in range(size)]
        self._next = itertools.cycle(self.clients)
        self.paused_until = 0.0

    def client(self) -> openai.AsyncOpenAI:
        return next(self._next)

    async def wait_if_paused(self) -> None:
        delay = self.paused_until - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def model_api_key(name: str) -> str:
    """The value of the agent's key variable when it is on the allow-list (AGENTOPS_MODEL_KEY_ENVS).

    Checked here too, not only in the admin form: a row written another way (a shell, a fixture,
    a migration) must not send a server secret to the agent's base URL. A refused name sends no
    key at all; the model answers 401 and the turn fails with ``authentication_error``.
    """
    name = name or "OPENAI_API_KEY"
    if name not in settings.AGENTOPS_MODEL_KEY_ENVS:
        log.warning("agent api_key_env %r is not in AGENTOPS_MODEL_KEY_ENVS: no key sent", name)
        return "not-needed"
    return os.environ.get(name) or "not-needed"


class ModelClients:
    """The gateway's model clients, per endpoint and key, made on (and bound to) its event loop."""

    def __init__(self, per_endpoint: int = 8) -> None:
        self.per_endpoint = per_endpoint
        self._endpoints: dict[tuple[str, str], _Endpoint] = {}

    def endpoint(self, profile: AgentProfile) -> _Endpoint:
        base_url = profile.base_url or settings.AGENTOPS_MODEL_BASE_URL or None
        api_key = model_api_key(profile.api_key_env)
        key = (base_url or "", api_key)
        if key not in self._endpoints:
            self._endpoints[key] = _Endpoint(base_url, api_key, self.per_endpoint)
        return self._endpoints[key]

    async def close(self) -> None:
        for endpoint in self._endpoints.values():
            for client in endpoint.clients:
                await client.close()
        self._endpoints.clear()


def tools_param(profile: AgentProfile, subset: Any = None) -> list[dict[str, Any]]:
    """The agent's enabled tools as the model sees them (from the cached registry); ``subset`` (a
    subagent's list of tool names, ``metadata["agentops_tools"]``) narrows them, as the gate does."""
    names, defs = tool_names_of_agent(profile.pk), tool_definitions_by_name()
    if isinstance(subset, list):
        names = names & frozenset(subset)
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters_schema or {"type": "object"}}}
            for name in sorted(names) if (t := defs.get(name)) is not None and t.enabled]


@dataclass
class ModelReply:
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = ""
    # The prohibitions check made for this reply (``prohibitions.py``): per call id its verdicts,
    # and what that call cost (counted in the session's tokens, not in this call's prompt).
    checks: dict[str, Any] | None = None
    check_prompt_tokens: int = 0
    check_completion_tokens: int = 0
    # With ``hold_delta``: the streamed text not yet reported when the stream ended, for the
    # caller to record as the last ``model.delta`` with the reply (one write instead of two).
    held_delta: str = ""


class _DeltaFlusher:
    """Buffers streamed text and reports it as ``model.delta`` at most every 100 ms."""

    def __init__(self, sink: EventSink) -> None:
        # Counted from the request: a reply that streams in within the interval is reported once,
        # with the reply itself when the caller holds the last delta back.
        self.sink, self.buffer, self.last = sink, "", time.monotonic()

    async def add(self, text: str) -> None:
        self.buffer += text
        if time.monotonic() - self.last >= DELTA_INTERVAL_SECONDS:
            await self.flush()

    async def flush(self) -> None:
        if self.buffer:
            text, self.buffer, self.last = self.buffer, "", time.monotonic()
            await self.sink("model.delta", {"text": text})


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def add_tool_call_delta(calls: dict[int, dict[str, str]], tc: Any) -> None:
    """Fold one streamed piece of a tool call (a chunk's ``delta.tool_calls[i]``, plain JSON) into
    ``calls`` by the call's index; a piece without an integer index is not a tool call's and is skipped."""
    tc = _dict(tc)
    index = tc.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        return
    slot = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
    if _text(tc.get("id")):
        slot["id"] = tc["id"]
    function = _dict(tc.get("function"))
    slot["name"] += _text(function.get("name"))
    slot["arguments"] += _text(function.get("arguments"))


def chunk_fold(reply: "ModelReply", calls: dict[int, dict[str, str]], chunk: Any) -> str:
    """Fold one streamed chat-completion chunk (plain JSON) into ``reply`` and ``calls``; returns
    the text it adds. Whatever does not have the shape of a chunk's field is ignored, as the SDK's
    own unvalidated models would leave it unset."""
    chunk = _dict(chunk)
    usage = _dict(chunk.get("usage"))
    if usage:
        reply.prompt_tokens = _count(usage.get("prompt_tokens"))
        reply.completion_tokens = _count(usage.get("completion_tokens"))
    text = ""
    for choice in _list(chunk.get("choices")):
        choice = _dict(choice)
        delta = _dict(choice.get("delta"))
        text += _text(delta.get("content"))
        for tc in _list(delta.get("tool_calls")):
            add_tool_call_delta(calls, tc)
        if _text(choice.get("finish_reason")):
            reply.finish_reason = choice["finish_reason"]
    reply.content += text
    return text


def _dumps(value: Any) -> bytes:
    # As the SDK encodes a request body (openai._utils._json.openapi_dumps).
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class RequestBodies:
    """The request bodies of one conversation, each message JSON-encoded once: a call's body costs
    its new messages, where the SDK's encoder walks the whole history again on every call. A
    message is recognised by identity: the conversation appends messages and never edits them."""

    def __init__(self) -> None:
        self._messages: list[tuple[Any, bytes]] = []
        self._head: tuple[str, Any, bytes] | None = None

    def body(self, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bytes:
        if self._head is None or self._head[0] != model or self._head[1] is not tools:
            fields: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
            if tools:
                fields["tools"] = tools
            self._head = (model, tools, _dumps(fields)[:-1])
        encoded = self._messages
        for i, message in enumerate(messages):
            if i == len(encoded):
                encoded.append((message, _dumps(message)))
            elif encoded[i][0] is not message:
                encoded[i] = (message, _dumps(message))
        del encoded[len(messages):]
        return self._head[2] + b',"messages":[' + b",".join(text for _, text in encoded) + b"]}"


async def _call_once(client: openai.AsyncOpenAI, *, model: str, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]], sink: EventSink, hold_delta: bool = False,
                     bodies: RequestBodies | None = None) -> ModelReply:
    content = (bodies or RequestBodies()).body(model=model, messages=messages, tools=tools)
    reply = ModelReply()
    calls: dict[int, dict[str, Any]] = {}
    flusher = _DeltaFlusher(sink)
    # The SDK's transport, without `create()`'s request transformation: that walks every message
    # of the history on every call (see bench/README.md); our messages are plain JSON already.
    # Chunks come as the JSON they are (`AsyncStream[object]`): building the SDK's objects for
    # each was a tenth of the gateway's CPU (py-spy), and we read four fields of them.
    stream = await client.post("/chat/completions", content=content, cast_to=ChatCompletion, stream=True,
                               stream_cls=openai.AsyncStream[object])
    async for chunk in stream:
        text = chunk_fold(reply, calls, chunk)
        if text:
            await flusher.add(text)
    if hold_delta:
        reply.held_delta = flusher.buffer
    else:
        await flusher.flush()
    reply.tool_calls = [calls[i] for i in sorted(calls)]
    return reply


def _retry_after(exc: openai.APIStatusError) -> float:
    """Seconds the endpoint asked us to wait (Retry-After, in seconds), capped; 1 s when unsaid."""
    try:
        return min(max(float(exc.response.headers.get("retry-after", "1")), 0.0), MAX_RETRY_AFTER_SECONDS)
    except ValueError:
        return 1.0


async def call_model(*, clients: ModelClients, profile: AgentProfile, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]], sink: EventSink, hold_delta: bool = False,
                     bodies: RequestBodies | None = None) -> ModelReply:
    """Call the agent's endpoint with bounded retries. Raises ModelCallFailed. ``tools`` is
    ``tools_param(profile)``, read by the caller off the event loop (it reads the database).
    ``hold_delta``: the last streamed text is left in ``reply.held_delta`` for the caller to record.
    ``bodies``: the conversation's encoded messages, kept across its calls."""
    endpoint = clients.endpoint(profile)
    last_error = ""
    attempt, failures = 0, 0
    patience_until = time.monotonic() + RATE_LIMIT_PATIENCE_SECONDS
    while failures <= len(RETRY_DELAYS):
        attempt += 1
        await endpoint.wait_if_paused()
        try:
            reply = await _call_once(endpoint.client(), model=profile.model, messages=messages, tools=tools,
                                     sink=sink, hold_delta=hold_delta, bodies=bodies)
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise ModelCallFailed("authentication_error", f"The model endpoint refused our credentials: {exc}",
                                  retryable=False) from exc
        except openai.RateLimitError as exc:
            # Slow down every call to this endpoint, not just this one; not a failure of ours.
            pause = _retry_after(exc)
            endpoint.paused_until = max(endpoint.paused_until, time.monotonic() + pause)
            last_error = f"RateLimitError: {exc}"
            await sink("model.retrying", {"attempt": attempt, "error": last_error[:500], "retry_after": pause})
            if time.monotonic() + pause > patience_until:
                break
            continue
        except (openai.APITimeoutError, openai.APIConnectionError, openai.InternalServerError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        except openai.APIStatusError as exc:
            if exc.status_code < 500:
                body = str(exc)
                if getattr(exc, "code", None) == "context_length_exceeded":
                    raise ModelCallFailed("context_length_exceeded", f"The prompt exceeds the model's context "
                                          f"window: {body[:500]}", retryable=False) from exc
                code = "policy_refusal" if "content_filter" in body or "policy" in body.lower() else "model_error"
                raise ModelCallFailed(code, f"The model endpoint refused the request: {body[:500]}",
                                      retryable=False) from exc
            last_error = f"HTTP {exc.status_code}: {exc}"
        else:
            if reply.finish_reason == "content_filter":
                if reply.held_delta:  # what streamed before the refusal is still shown
                    await sink("model.delta", {"text": reply.held_delta})
                raise ModelCallFailed("policy_refusal", "The model refused (content filter).", retryable=False)
            return reply
        log.warning("model call failed (attempt %d): %s", attempt, last_error)
        await sink("model.retrying", {"attempt": attempt, "error": last_error[:500]})
        if failures < len(RETRY_DELAYS):
            await asyncio.sleep(RETRY_DELAYS[failures])
        failures += 1
    raise ModelCallFailed("model_unavailable", f"The model endpoint kept failing: {last_error[:500]}",
                          retryable=True)


def assistant_message(reply: ModelReply) -> dict[str, Any]:
    """The assistant message as stored and replayed: content, and the tool calls with their ids."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if reply.tool_calls:
        message["tool_calls"] = [{"id": c["id"] or f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"] or "{}"}}
                                 for c in reply.tool_calls]
    return message


def reply_event_fields(message: dict[str, Any], reply: ModelReply) -> dict[str, Any]:
    """What a ``model.completed`` event says of the reply (beside the step's own fields)."""
    return {"content": reply.content, "tool_calls": message.get("tool_calls", []),
            "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens}}


def planned_calls(message: dict[str, Any]) -> list[tuple[str, str, dict[str, Any], str]]:
    """(tool name, call id, arguments, error) per tool call of an assistant message; error says
    why the arguments are unusable (the gate fails such a step before anyone is asked about it)."""
    calls = []
    for call in message.get("tool_calls", []):
        error = ""
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except json.JSONDecodeError as exc:
            arguments, error = {}, f"The arguments are not valid JSON ({exc}): {call['function']['arguments'][:300]}"
        if not isinstance(arguments, dict) and not error:
            arguments, error = {}, f"The arguments must be a JSON object: {call['function']['arguments'][:300]}"
        calls.append((call["function"]["name"], call["id"], arguments, error))
    return calls
