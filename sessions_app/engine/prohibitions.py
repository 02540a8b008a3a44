"""The prohibitions check: before a call that a reviewer will be asked about is recorded, a model
call judges it against the session's prohibitions; the verdicts go on the tool step and are shown
to the reviewer next to the arguments (a likely violation raises the request's risk to high).

It rides on the model step that planned the calls (the gateway makes it right after the reply,
before recording it): like the reply, it has no side effects, and a model step re-run after a
crash re-runs it. Read-only calls that run without a reviewer are not checked. A check that fails
(the endpoint is down) does not fail the turn: the reviewer is told the check is missing.

The request: a system message carrying ``PROHIBITIONS_MARKER`` and the instructions, and one user
message listing the prohibitions and the proposed calls (id, name, arguments).
"""

import json
from typing import Any

from sessions_app.engine import llm
from sessions_app.models import AgentSession
from tools_app.models import ApprovalMode
from tools_app.selectors import tool_definitions_by_name

PROHIBITIONS_MARKER = "[[agentops:prohibitions]]"
INSTRUCTIONS = (
    f"{PROHIBITIONS_MARKER} You check an agent's proposed tool calls against the operator's prohibitions, "
    "before a human reviewer sees them. Answer with one JSON object and nothing else: "
    '{"checks": [{"call_id": "<id>", "prohibition": "<verbatim>", "violated": true|false, "evidence": "<why>"}]}, '
    "one entry per call and prohibition."
)


def calls_to_check(session: AgentSession, reply: llm.ModelReply) -> list[dict[str, Any]]:
    """The reply's calls that may go to a reviewer (every tool that is not read-only), when the
    session has prohibitions."""
    if not session.prohibitions or not reply.tool_calls:
        return []
    tools = tool_definitions_by_name()
    return [c for c in llm.assistant_message(reply).get("tool_calls", [])
            if (tool := tools.get(c["function"]["name"])) is None or tool.approval_mode != ApprovalMode.SAFE_READONLY]


def prohibitions_request(session: AgentSession, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    prohibitions = "\n".join(f"{i}. {p}" for i, p in enumerate(session.prohibitions, start=1))
    proposed = "\n".join(f"- {c['id']}: {c['function']['name']}({c['function']['arguments']})" for c in calls)
    return [{"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": f"Prohibitions:\n{prohibitions}\n\nProposed calls:\n{proposed}"}]


def checks_parse(text: str, prohibitions: list[str], calls: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per call id, one verdict per prohibition, in order; one the reply leaves out is unknown (None)."""
    try:
        value = json.loads(text[text.find("{"):text.rfind("}") + 1])
    except (json.JSONDecodeError, ValueError):
        value = {}
    given: dict[tuple[str, str], dict[str, Any]] = {}
    for item in (value.get("checks") if isinstance(value, dict) else None) or []:
        if isinstance(item, dict):
            given[(str(item.get("call_id", "")), str(item.get("prohibition", "")).strip())] = item
    result: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        rows = []
        for prohibition in prohibitions:
            item = given.get((call["id"], prohibition.strip()))
            violated = None if item is None else item.get("violated") is True
            rows.append({"prohibition": prohibition, "violated": violated,
                         "evidence": str((item or {}).get("evidence") or "The check gave no verdict.")[:1000]})
        result[call["id"]] = rows
    return result


def checks_unavailable(prohibitions: list[str], calls: list[dict[str, Any]], error: str) -> dict[str, Any]:
    return {c["id"]: [{"prohibition": p, "violated": None, "evidence": f"The check could not run: {error[:300]}"}
                      for p in prohibitions] for c in calls}
