"""Writes of fanout_app: the spawn tool's definition; batches (``batches.py``)."""

from tools_app.models import ApprovalMode, ToolDefinition


def spawn_tool_seed() -> ToolDefinition:
    """The ``spawn_subagents`` tool definition, created when missing (admin edits survive).

    Safe to run without asking: it starts sessions whose own risky calls ask reviewers.
    """
    from fanout_app.subagents import SPAWN_SCHEMA, SPAWN_TOOL

    tool, _ = ToolDefinition.objects.get_or_create(
        name=SPAWN_TOOL,
        defaults={"description": "Delegate work to subagents: one child session per task, run in parallel, each "
                                 "with its own context and workspace. Returns every subagent's answer and "
                                 "published files at once.",
                  "kind": ToolDefinition.Kind.BUILTIN, "parameters_schema": SPAWN_SCHEMA,
                  "approval_mode": ApprovalMode.SAFE_READONLY, "timeout_seconds": 1800, "idempotent": True})
    return tool
