"""The OpenAI chat-completions wire format: request validation, response bodies and SSE chunks."""

import re
from collections.abc import Iterator
from typing import Any

from scripted_model.planner import Reply

MODEL_ID = "scripted"

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


class RequestError(ValueError):
    """The request itself is malformed; rendered as an OpenAI-style error body."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


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


def model_card(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "agentops"}
