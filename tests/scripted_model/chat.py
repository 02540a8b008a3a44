"""Talking to the scripted model as the product does: through the openai SDK, feeding results back."""

from typing import Any

from openai import OpenAI

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    for name in ("list_files", "read_file", "write_file", "run_command")
]


def ask(client: OpenAI, messages: list[Any]) -> Any:
    return client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)


def assistant_turn(message: Any) -> dict[str, Any]:
    """The assistant message as the product would send it back in the next request."""
    return message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})


def tool_result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}
