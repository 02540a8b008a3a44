"""The incident demo when the agent has the incident tracker (an MCP server, ``tracker``): the
classic demo plus a look at the open tickets (read-only) and a comment on the incident's ticket
(mutating: a reviewer approves it). Chosen only when the request offers the tracker's tools, so
a request without them plays the classic demo unchanged."""

import json
from typing import Any

from scripted_model.demo import DEMO_REPORT, DEMO_RESTART_COMMAND, demo_steps
from scripted_model.script import ScriptStep, ToolCall

TRACKER_LIST = "tracker__list_tickets"
TRACKER_COMMENT = "tracker__comment_ticket"
TRACKER_TICKET = "INC-101"
TRACKER_COMMENT_TEXT = ("Root cause: SETTLEMENT_BATCH_SIZE raised 5000 -> 50000 (rev 4c2e91a); the payments worker "
                        "is OOM-killed loading one batch. Restarted it with 5000; revert of 4c2e91a proposed.")
MCP_DEMO_REPORT = DEMO_REPORT.replace(
    "**Follow-up:**", f"**Ticket:** {TRACKER_TICKET} in the incident tracker got the root cause as a comment "
                      "(a reviewer approved it).\n\n**Follow-up:**")


def _offered(tools: list[dict[str, Any]] | None) -> set[str]:
    names = set()
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return names


def demo_for(tools: list[dict[str, Any]] | None) -> list[ScriptStep]:
    """The demo to play for a request offering ``tools``."""
    if not {TRACKER_LIST, TRACKER_COMMENT} <= _offered(tools):
        return demo_steps()

    def call(index: int, name: str, arguments: dict[str, Any]) -> ScriptStep:
        return ScriptStep(index, (ToolCall(name=name, arguments=json.dumps(arguments)),))

    return [
        call(0, "list_files", {"path": "."}),
        call(1, "read_file", {"path": "logs/service.log"}),
        call(2, TRACKER_LIST, {"status": "open"}),
        call(3, "run_command", {"command": DEMO_RESTART_COMMAND}),
        call(4, "read_file", {"path": "state/payments-worker.restarted"}),
        call(5, TRACKER_COMMENT, {"ticket_id": TRACKER_TICKET, "comment": TRACKER_COMMENT_TEXT}),
        ScriptStep(6, (), MCP_DEMO_REPORT),
    ]
