"""A small incident tracker served over MCP (stdio) for the incident-responder demo.

Run by agentops inside the sandbox (a kept process per session), with the session's workspace at
/workspace: the tickets live in ``/workspace/.incident_tracker.json`` (seeded on first use), so
each demo session has its own tracker. Standalone on purpose: it needs only the ``mcp`` package.

Tools: ``list_tickets`` (read-only), ``open_ticket`` and ``comment_ticket`` (both change the
tracker; comment is the one the demo asks a reviewer about).
"""

import json
import os
from pathlib import Path
from typing import Any

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

STORE = Path(os.environ.get("INCIDENT_TRACKER_FILE", "/workspace/.incident_tracker.json"))
SEED = [
    {"id": "INC-101", "title": "PaymentsQueueBacklog firing", "status": "open", "severity": "sev2",
     "comments": ["Alert fired at 10:01:58Z: queue_depth=1804 > 1000 for 60s."]},
    {"id": "INC-098", "title": "Slow dashboard queries", "status": "resolved", "severity": "sev4", "comments": []},
]

mcp = FastMCP("incident-tracker")


def _load() -> list[dict[str, Any]]:
    if not STORE.exists():
        return [dict(t, comments=list(t["comments"])) for t in SEED]
    data: list[dict[str, Any]] = json.loads(STORE.read_text())
    return data


def _save(tickets: list[dict[str, Any]]) -> None:
    tmp = STORE.with_suffix(".tmp")
    tmp.write_text(json.dumps(tickets, indent=1))
    tmp.replace(STORE)


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True))
def list_tickets(status: str = "open") -> list[dict[str, Any]]:
    """List incident tickets by status ("open", "resolved" or "all")."""
    return [t for t in _load() if status == "all" or t["status"] == status]


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False))
def open_ticket(title: str, severity: str = "sev3") -> dict[str, Any]:
    """Open a new incident ticket; returns it."""
    tickets = _load()
    ticket = {"id": f"INC-{102 + len(tickets)}", "title": title, "status": "open", "severity": severity,
              "comments": []}
    _save([*tickets, ticket])
    return ticket


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False))
def comment_ticket(ticket_id: str, comment: str) -> str:
    """Add a comment to a ticket (visible to the whole on-call rotation)."""
    tickets = _load()
    for ticket in tickets:
        if ticket["id"] == ticket_id:
            ticket["comments"].append(comment)
            _save(tickets)
            return f"Comment {len(ticket['comments'])} added to {ticket_id}."
    raise ValueError(f"no ticket {ticket_id}")


if __name__ == "__main__":
    mcp.run("stdio")
