"""The model call through the openai SDK: bounded retries, deltas streamed as events.

Model calls have no side effects, so they are retried on timeouts, 429, 5xx and connection
errors (bounded, with backoff) and fail at once on authentication and policy errors.
"""

import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import openai
from django.conf import settings
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

from sessions_app.events import event_record
from sessions_app.models import AgentProfile, AgentSession, Step
from tools_app.selectors import tool_definitions_by_name, tool_names_of_agent

log = logging.getLogger(__name__)

DELTA_INTERVAL_SECONDS = 0.1  # coalesce streamed text: at most ~10 model.delta events a second
RETRY_DELAYS = (0.2, 0.8, 2.0)


def model_lease_seconds() -> float:
    """A model step's lease outlives every attempt of its call, plus the lease margin."""
    timeout = float(settings.AGENTOPS_MODEL_TIMEOUT_SECONDS)
    return timeout * (1 + len(RETRY_DELAYS)) + sum(RETRY_DELAYS) + float(settings.AGENTOPS_LEASE_SECONDS)

_clients: dict[tuple[str, str], openai.OpenAI] = {}
_clients_lock = threading.Lock()


class ModelCallFailed(Exception):
    def __init__(self, code: str, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.code, self.message, self.retryable = code, message, retryable


def client_for(profile: AgentProfile) -> openai.OpenAI:
    base_url = profile.base_url or settings.AGENTOPS_MODEL_BASE_URL or None
    api_key = os.environ.get(profile.api_key_env or "OPENAI_API_KEY") or "not-needed"
    key = (base_url or "", api_key)
    with _clients_lock:
        if key not in _clients:
            # Our own bounded retries (below) record each attempt; the SDK's would hide them.
            _clients[key] = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                          timeout=float(settings.AGENTOPS_MODEL_TIMEOUT_SECONDS))
        return _clients[key]


def tools_param(profile: AgentProfile) -> list[dict[str, Any]]:
    """The agent's enabled tools as the model sees them (from the cached registry)."""
    names, defs = tool_names_of_agent(profile.pk), tool_definitions_by_name()
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


class _DeltaFlusher:
    """Buffers streamed text and records it as model.delta events at most every 100 ms."""

    def __init__(self, step: Step) -> None:
        self.step, self.buffer, self.last = step, "", 0.0

    def add(self, text: str) -> None:
        self.buffer += text
        if time.monotonic() - self.last >= DELTA_INTERVAL_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            event_record(session_id=self.step.session_id, turn_id=self.step.turn_id, step_id=self.step.id,
                         type="model.delta", payload={"text": self.buffer})
            self.buffer, self.last = "", time.monotonic()


def add_tool_call_delta(calls: dict[int, dict[str, str]], tc: ChoiceDeltaToolCall) -> None:
    """Fold one streamed piece of a tool call into ``calls`` (by the call's index)."""
    slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
    if tc.id:
        slot["id"] = tc.id
    if tc.function and tc.function.name:
        slot["name"] += tc.function.name
    if tc.function and tc.function.arguments:
        slot["arguments"] += tc.function.arguments


def _call_once(client: openai.OpenAI, *, model: str, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]], step: Step) -> ModelReply:
    kwargs: dict[str, Any] = {"model": model, "messages": messages, "stream": True,
                              "stream_options": {"include_usage": True}}
    if tools:
        kwargs["tools"] = tools
    reply = ModelReply()
    calls: dict[int, dict[str, Any]] = {}
    flusher = _DeltaFlusher(step)
    # The SDK's transport, without `create()`'s request transformation: that walks every message
    # of the history on every call (see bench/README.md); our messages are plain JSON already.
    stream = client.post("/chat/completions", body=kwargs, cast_to=ChatCompletion, stream=True,
                         stream_cls=openai.Stream[ChatCompletionChunk])
    for chunk in stream:
        if chunk.usage is not None:
            reply.prompt_tokens = chunk.usage.prompt_tokens or 0
            reply.completion_tokens = chunk.usage.completion_tokens or 0
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                reply.content += delta.content
                flusher.add(delta.content)
            for tc in delta.tool_calls or []:
                add_tool_call_delta(calls, tc)
            if choice.finish_reason:
                reply.finish_reason = choice.finish_reason
    flusher.flush()
    reply.tool_calls = [calls[i] for i in sorted(calls)]
    return reply


def call_model(step: Step, *, session: AgentSession, messages: list[dict[str, Any]]) -> ModelReply:
    """Call the session's agent's endpoint for a claimed model step, with bounded retries, recording
    streamed text as ``model.delta`` events. Raises ModelCallFailed."""
    tools = tools_param(session.agent)
    client = client_for(session.agent)
    last_error = ""
    for attempt, delay in enumerate((0.0, *RETRY_DELAYS)):
        if delay:
            time.sleep(delay)
        try:
            reply = _call_once(client, model=session.agent.model, messages=messages, tools=tools, step=step)
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise ModelCallFailed("authentication_error", f"The model endpoint refused our credentials: {exc}",
                                  retryable=False) from exc
        except (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError,
                openai.InternalServerError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
            log.warning("model call for step %s failed (attempt %d): %s", step.id, attempt + 1, last_error)
            event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="model.retrying",
                         payload={"attempt": attempt + 1, "error": last_error[:500]})
            continue
        except openai.APIStatusError as exc:
            if exc.status_code >= 500:
                last_error = f"HTTP {exc.status_code}: {exc}"
                continue
            body = str(exc)
            code = "policy_refusal" if "content_filter" in body or "policy" in body.lower() else "model_error"
            raise ModelCallFailed(code, f"The model endpoint refused the request: {body[:500]}",
                                  retryable=False) from exc
        if reply.finish_reason == "content_filter":
            raise ModelCallFailed("policy_refusal", "The model refused (content filter).", retryable=False)
        return reply
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
