"""What the model is sent: the system prompt with the pinned context, then the history, rebuilt
from the database (never from a worker's memory)."""

import uuid
from typing import Any

from sessions_app.models import AgentSession, Step, Turn


def system_prompt(session: AgentSession) -> str:
    """The agent's instructions, then the pinned context, verbatim."""
    parts = [session.agent.instructions.strip()] if session.agent.instructions.strip() else []
    for title, items in (("Requirements", session.requirements), ("Prohibitions", session.prohibitions),
                         ("Acceptance criteria", session.acceptance_criteria)):
        if items:
            parts.append(f"{title} (pinned by the operator; always apply):\n" + "\n".join(f"- {x}" for x in items))
    return "\n\n".join(parts) or "You are a helpful agent."


def tool_result_text(step: Step) -> str:
    """What the model is told about a finished tool step."""
    result = step.result or {}
    if step.status == Step.Status.REJECTED:
        return str(result.get("output") or "The reviewer rejected this call.")
    if step.status == Step.Status.EXPIRED:
        return "The approval request expired before a reviewer decided; the call did not run (expired, not rejected)."
    if step.status == Step.Status.CANCELLED:
        return "The call was cancelled."
    text = str(result.get("output", ""))
    if result.get("error_code"):
        text = f"[error: {result['error_code']}] {text}"
    if result.get("exit_code") not in (None, 0):
        text = f"[exit code {result['exit_code']}] {text}"
    if result.get("reviewer_note"):
        text = f"{result['reviewer_note']}\n{text}"
    return text


def tool_message(step: Step) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": step.call_id, "content": tool_result_text(step)}


def build_messages(session: AgentSession) -> list[dict[str, Any]]:
    """The whole conversation from the database, pinned context first. Two queries."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(session)}]
    turns = list(Turn.objects.filter(session=session).order_by("index").values_list("id", "input"))
    steps_by_turn: dict[uuid.UUID, list[Step]] = {}
    # Only the columns the prompt needs: this runs before every model call.
    fields = ("id", "turn_id", "index", "kind", "status", "call_id", "message", "result")
    for step in Step.objects.filter(session=session, status__in=Step.SETTLED).only(*fields).order_by("index"):
        steps_by_turn.setdefault(step.turn_id, []).append(step)
    for turn_id, text in turns:
        messages.append({"role": "user", "content": text})
        for step in steps_by_turn.get(turn_id, []):
            if step.kind == Step.Kind.MODEL and step.status == Step.Status.COMPLETED and step.message:
                messages.append(step.message)
            elif step.kind == Step.Kind.TOOL:
                messages.append(tool_message(step))
    return messages
