"""Extension points of the engine for apps layered above it (``fanout_app``: subagents).

A lower layer never imports a higher one: the higher app registers here in ``AppConfig.ready()``.

- ``ENGINE_TOOLS``: tools the engine runs itself instead of a sandbox or a client. ``gate`` replaces
  the approval gate for a planned step (it may leave the step running *without* a lease: the turn
  waits and no worker is held); ``poll`` is asked, under the session lock, by every tick of a turn
  whose step waits, and settles it when its work is done. Both return the step's new status.
- ``TURN_ENDED``: called inside the transaction that moved a turn to completed, failed or cancelled.
- ``EVENT_FRAGMENTS``: event type → extra live fragment HTML for that event (the subagent cards).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineTool:
    gate: Callable[..., str]   # (*, step, session) -> status
    poll: Callable[..., str]   # (*, step, session) -> status


ENGINE_TOOLS: dict[str, EngineTool] = {}
TURN_ENDED: list[Callable[[Any], None]] = []
EVENT_FRAGMENTS: dict[str, Callable[[dict[str, Any]], str]] = {}


def engine_tool_waits(tool_name: str) -> bool:
    return tool_name in ENGINE_TOOLS


def turn_ended(turn: Any) -> None:
    for hook in TURN_ENDED:
        hook(turn)
