"""What the model is sent: the system prompt with the pinned context, then the history, rebuilt
from the database (never from a worker's memory).

After a compaction (``context.py``): system prompt + pinned context verbatim, the newest summary
(it folds in the older ones), then the history after the cut, whole. The latest turn's user input
is always kept: when the cut lies inside that turn it comes first and the summary after it.
"""

import json
import uuid
from typing import Any

from django.db.models import Q

from sessions_app.engine.context import Cut, latest_cut
from sessions_app.models import AgentSession, Step, Turn

SUMMARY_HEADER = "Summary of the earlier history (compacted; the steps it replaces are no longer shown):"


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


def summary_message(summary: dict[str, Any]) -> dict[str, Any]:
    return {"role": "system", "content": f"{SUMMARY_HEADER}\n{json.dumps(summary, ensure_ascii=False)}"}


def build_messages(session: AgentSession, *, cut: Cut | None = None, latest: bool = True) -> list[dict[str, Any]]:
    """The conversation from the database, pinned context first, from the newest compaction on
    (``cut``: that one instead; ``latest=False``: none, the whole history). Three queries; flat
    in the length of the session once it has compacted."""
    if cut is None and latest:
        cut = latest_cut(session.pk)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(session)}]
    turn_filter, step_filter = Q(session=session), Q(session=session, status__in=Step.SETTLED)
    if cut is not None:
        (t, i) = cut.through
        turn_filter &= Q(index__gte=t)
        step_filter &= Q(turn__index__gt=t) | Q(turn__index=t, index__gt=i)
    turns = list(Turn.objects.filter(turn_filter).order_by("index").values_list("id", "index", "input"))
    steps_by_turn: dict[uuid.UUID, list[Step]] = {}
    # Only the columns the prompt needs: this runs before every model call.
    fields = ("id", "turn_id", "index", "kind", "status", "call_id", "message", "result")
    from sessions_app.engine.verification import verification_message
    for step in Step.objects.filter(step_filter).only(*fields).order_by("index"):
        steps_by_turn.setdefault(step.turn_id, []).append(step)
    if cut is not None:
        newest = turns[-1][1] if turns else None
        if newest == cut.through[0]:
            messages.append({"role": "user", "content": turns[-1][2]})  # the task at hand stays whole
        messages.append(summary_message(cut.summary))
    for turn_id, index, text in turns:
        if cut is None or index > cut.through[0]:
            messages.append({"role": "user", "content": text})
        for step in steps_by_turn.get(turn_id, []):
            if step.kind == Step.Kind.MODEL and step.status == Step.Status.COMPLETED and step.message:
                messages.append(step.message)
            elif step.kind == Step.Kind.TOOL:
                messages.append(tool_message(step))
            elif (step.kind == Step.Kind.VERIFICATION and step.status == Step.Status.COMPLETED
                  and not (step.result or {}).get("all_met")):
                messages.append(verification_message(step))
    return messages
