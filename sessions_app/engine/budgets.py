"""Budgets: tool calls, model calls, tokens and wall time per session. Pure functions.

Crossing a budget fails the turn with ``budget_exceeded`` and a ``budget.exceeded`` event, never
silently. A model call is checked against tokens, wall time and model calls; a tool call against
tokens, wall time and tool calls.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sessions_app.engine.record import SESSION_FIELDS
from sessions_app.models import AgentSession


@dataclass(frozen=True)
class Budget:
    """A budget that the next call would cross."""

    name: str
    limit: int
    used: float

    def message(self) -> str:
        return f"The session's budget {self.name} ({self.limit}) is used up ({self.used:g})."


def session_counters(session: AgentSession) -> dict[str, Any]:
    """The counters and budgets of a session row, as ``step_outcome_record`` returns them."""
    return {name: getattr(session, name) for name in SESSION_FIELDS}


def budget_crossed(counters: Mapping[str, Any], turn_seconds: float, *,
                   before: Literal["model", "tool"]) -> Budget | None:
    """The budget the next model call or tool call would cross, if any. ``turn_seconds``: how long
    the current turn has run (the session's ``wall_seconds`` counts the finished turns)."""
    wall = float(counters["wall_seconds"]) + turn_seconds
    checks: list[tuple[str, int | None, float]] = [
        ("max_tokens", counters["max_tokens"], counters["prompt_tokens"] + counters["completion_tokens"]),
        ("max_wall_seconds", counters["max_wall_seconds"], wall),
    ]
    if before == "model":
        checks.append(("max_model_calls", counters["max_model_calls"], counters["model_calls"]))
    else:
        checks.append(("max_tool_calls", counters["max_tool_calls"], counters["tool_calls"]))
    for name, limit, used in checks:
        if limit is not None and used >= limit:
            return Budget(name, limit, used)
    return None
