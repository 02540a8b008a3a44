"""Writes for tools_app: seeding the tool registry (the email outbox is in outbox.py)."""

from .builtin import BUILTIN_TOOLS
from .models import ToolDefinition


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
