"""Runners for tools that are not built-ins: the hook through which another app (``mcp_app``)
runs the tools of its kind, without the engine or this app knowing it.

A runner is registered per ``ToolDefinition.kind`` (in its AppConfig.ready()); the engine asks
``tool_runner(kind)`` and, when there is one, calls it instead of ``execute_tool``. A runner never
raises for a failed call: it returns a failed ToolResult with an error code.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools_app.builtin import ToolResult


@dataclass(frozen=True)
class ToolRun:
    """One call as the engine hands it to a runner (ids only: the runner reads what it needs)."""

    tool_name: str
    arguments: dict[str, Any]
    workspace: Path
    timeout_seconds: int
    network: str
    team_id: int | None
    session_id: str
    step_id: str
    idempotency_key: str
    should_cancel: Callable[[], bool] | None = None


ToolRunner = Callable[[ToolRun], ToolResult]
_RUNNERS: dict[str, ToolRunner] = {}


def tool_runner_register(kind: str, runner: ToolRunner) -> None:
    _RUNNERS[kind] = runner


def tool_runner(kind: str) -> ToolRunner | None:
    """The runner of tools of ``kind``, or None (built-ins and client tools have none)."""
    return _RUNNERS.get(kind)
