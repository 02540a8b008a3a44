"""The model call: history rebuilt from the database, the openai SDK, deltas streamed as events.

Model calls have no side effects, so they are retried on timeouts, 429, 5xx and connection
errors (bounded, with backoff) and fail the turn at once on authentication and policy errors.
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
from django.db import transaction
from django.db.models import F
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

from agentops.domain import joins_transaction
from sessions_app.engine.state import turn_fail
from sessions_app.models import AgentProfile, AgentSession, Step, Turn
from sessions_app.services import event_record, session_lock, step_transition
from tools_app.selectors import tool_definitions_by_name

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


def system_prompt(session: AgentSession) -> str:
    parts = [session.agent.instructions.strip()] if session.agent.instructions.strip() else []
    for title, items in (("Requirements", session.requirements), ("Prohibitions", session.prohibitions),
                         ("Acceptance criteria", session.acceptance_criteria)):
        if items:
            parts.append(f"{title} (pinned by the operator; always apply):\n" + "\n".join(f"- {x}" for x in items))
    return "\n\n".join(parts) or "You are a helpful agent."


def tool_result_text(step: Step) -> str:
    """What the model is told about a finished tool step."""
    result = step.result or {}
    if step.status == Step.Status.REJECTED:
        return str(result.get("output") or "The reviewer rejected this call.")
    if step.status == Step.Status.EXPIRED:
        return "The approval request expired before a reviewer decided; the call did not run (expired, not rejected)."
    if step.status == Step.Status.CANCELLED:
        return "The call was cancelled."
    text = str(result.get("output", ""))
    if result.get("error_code"):
        text = f"[error: {result['error_code']}] {text}"
    if result.get("exit_code") not in (None, 0):
        text = f"[exit code {result['exit_code']}] {text}"
    if result.get("reviewer_note"):
        text = f"{result['reviewer_note']}\n{text}"
    return text


def build_messages(session: AgentSession) -> list[dict[str, Any]]:
    """The whole conversation from the database, pinned context first. Two queries."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(session)}]
    turns = list(Turn.objects.filter(session=session).order_by("index").values_list("id", "input"))
    steps_by_turn: dict[uuid.UUID, list[Step]] = {}
    # Only the columns the prompt needs: this runs before every model call.
    fields = ("id", "turn_id", "index", "kind", "status", "call_id", "message", "result")
    for step in Step.objects.filter(session=session, status__in=Step.SETTLED).only(*fields).order_by("index"):
        steps_by_turn.setdefault(step.turn_id, []).append(step)
    for turn_id, text in turns:
        messages.append({"role": "user", "content": text})
        for step in steps_by_turn.get(turn_id, []):
            if step.kind == Step.Kind.MODEL and step.status == Step.Status.COMPLETED and step.message:
                messages.append(step.message)
            elif step.kind == Step.Kind.TOOL:
                messages.append({"role": "tool", "tool_call_id": step.call_id, "content": tool_result_text(step)})
    return messages


_tools_cache: dict[int, tuple[float, list[dict[str, Any]]]] = {}
TOOLS_CACHE_SECONDS = 2.0  # an admin's change to a profile's tools shows within this


def tools_param(profile: AgentProfile) -> list[dict[str, Any]]:
    cached = _tools_cache.get(profile.pk)
    if cached and time.monotonic() - cached[0] < TOOLS_CACHE_SECONDS:
        return cached[1]
    tools = [
        {"type": "function", "function": {"name": t.name, "description": t.description,
                                          "parameters": t.parameters_schema or {"type": "object"}}}
        for t in profile.tools.filter(enabled=True).order_by("name")
    ]
    _tools_cache[profile.pk] = (time.monotonic(), tools)
    return tools


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
    # The SDK's transport, without `create()`'s request transformation: it walks every message
    # of the history on every call (165 ms at 400 messages, measured); our messages are plain
    # JSON already.
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


def call_model(step: Step, *, session: AgentSession | None = None,
               messages: list[dict[str, Any]] | None = None) -> ModelReply:
    """Call the profile's endpoint with bounded retries. Raises ModelCallFailed.

    ``session`` (with its agent) and ``messages`` are what the caller holds already; without them
    both are read from the database.
    """
    if session is None:
        session = AgentSession.objects.select_related("agent").get(pk=step.session_id)
    if messages is None:
        messages = build_messages(session)
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


def reply_event_payload(step: Step, message: dict[str, Any], reply: ModelReply) -> dict[str, Any]:
    return {"status": Step.Status.COMPLETED, "index": step.index, "kind": step.kind, "tool": step.tool_name,
            "content": reply.content, "tool_calls": message.get("tool_calls", []),
            "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens}}


def record_failure(step: Step, exc: ModelCallFailed) -> None:
    """The model call of a claimed step failed for good: fail the step and its turn."""
    with transaction.atomic():
        step_transition(step_id=step.id, to=Step.Status.FAILED, event_type="model.failed",
                        event_payload={"error_code": exc.code, "error": exc.message[:500]},
                        error_code=exc.code, error_message=exc.message[:2000])
        turn_fail(turn_id=step.turn_id, code=exc.code, message=exc.message, retryable=exc.retryable)


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


@joins_transaction
def record_reply(*, step: Step, reply: ModelReply, message: dict[str, Any] | None = None) -> list[Step]:
    """Store the assistant message, usage and the planned tool steps in one transaction."""
    session_lock(step.session_id)
    message = message or assistant_message(reply)
    step_transition(step_id=step.id, session_id=step.session_id, known=step, to=Step.Status.COMPLETED,
                    event_type="model.completed",
                    event_payload={"content": reply.content, "tool_calls": message.get("tool_calls", []),
                                   "usage": {"prompt_tokens": reply.prompt_tokens,
                                             "completion_tokens": reply.completion_tokens}},
                    message=message, prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
    AgentSession.objects.filter(pk=step.session_id).update(
        model_calls=F("model_calls") + 1, prompt_tokens=F("prompt_tokens") + reply.prompt_tokens,
        completion_tokens=F("completion_tokens") + reply.completion_tokens)
    Turn.objects.filter(pk=step.turn_id).update(prompt_tokens=F("prompt_tokens") + reply.prompt_tokens,
                                                 completion_tokens=F("completion_tokens") + reply.completion_tokens)
    modes = {name: tool.approval_mode for name, tool in tool_definitions_by_name().items()}
    return [Step.objects.create(
        session_id=step.session_id, turn_id=step.turn_id, index=step.index + i, kind=Step.Kind.TOOL,
        tool_name=name, call_id=call_id, arguments=arguments, error_message=error,
        error_code="invalid_arguments" if error else "",
        approval_mode=modes.get(name, "mutating"), idempotency_key=f"{step.turn_id}:{call_id}")
        for i, (name, call_id, arguments, error) in enumerate(planned_calls(message), start=1)]
