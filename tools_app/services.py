"""Writes for tools_app: seeding the tool registry (the email outbox is in outbox.py)."""

from typing import Any

from django.core.exceptions import ValidationError

from agentops.domain import Conflict, InvalidArguments

from .builtin import BUILTIN_TOOLS
from .models import ApprovalMode, ToolDefinition, validate_json_schema


def tool_definitions_seed() -> None:
    """Create a ToolDefinition for every built-in tool that has none.

    Existing rows are left alone: the admin may have changed the approval mode, timeout or network,
    and a deploy must never undo that.
    """
    for tool in BUILTIN_TOOLS.values():
        ToolDefinition.objects.get_or_create(
            name=tool.name,
            defaults={"description": tool.description, "kind": ToolDefinition.Kind.BUILTIN,
                      "parameters_schema": tool.parameters_schema, "approval_mode": tool.approval_mode,
                      "network": tool.network, "timeout_seconds": tool.timeout_seconds,
                      "idempotent": tool.idempotent},
        )


def tool_definition_client_ensure(*, name: str, description: str, parameters_schema: dict[str, Any]) -> ToolDefinition:
    """The tool ``name`` for an integration's function: a client tool (the integration runs it and
    posts the output by call_id), created when missing.

    A built-in of that name is the built-in (the server runs it under its own approval mode). A
    client tool of that name with another parameters schema is refused: another agent's calls
    would be validated against a schema their integration never declared.
    """
    try:
        validate_json_schema(parameters_schema)
    except ValidationError as exc:
        raise InvalidArguments(f"Tool {name!r}: {'; '.join(exc.messages)}", details={"field": "tools"}) from exc
    tool, created = ToolDefinition.objects.get_or_create(
        name=name, defaults={"description": description, "kind": ToolDefinition.Kind.CLIENT,
                             "parameters_schema": parameters_schema,
                             "approval_mode": ApprovalMode.SAFE_READONLY})
    if created or tool.kind == ToolDefinition.Kind.BUILTIN:
        return tool
    if tool.parameters_schema != parameters_schema:
        raise Conflict(f"A client tool named {name!r} exists with another parameters schema.",
                       code="tool_name_taken", details={"tool": name})
    if description and tool.description != description:
        ToolDefinition.objects.filter(pk=tool.pk).update(description=description)
    return tool
