"""How big the next prompt is, and which part of the history a compaction replaces.

The estimate (documented; no tokenizer is downloaded at run time):

    next prompt ≈ the previous model call's reported ``prompt_tokens``
                  + (characters added to the history since) / ``CHARS_PER_TOKEN``

where "added since" is that call's own reply and every tool result and user input recorded after
it, counted with ``message_chars`` (role + text + tool-call names and arguments). After a
compaction the basis is the compaction's ``tokens_after`` (the new prompt's characters / 4). The
scripted model enforces its ``--context-window`` with the same characters / 4, so the two agree.

A compaction replaces a prefix of the history, up to ``through`` = ``(turn index, step index)``
(step index -1 = the turn's user input). The cut lands on a group boundary (before a model step
or a user input), so a tool result is never separated from the call that asked for it, and the
last ``keep_recent_steps`` steps and every unanswered tool call (they follow the newest model
step) stay whole.
"""

from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from sessions_app.models import AgentProfile, Step, Turn

CHARS_PER_TOKEN = 4
OVERFLOW = "context_length_exceeded"  # the provider's code for a prompt over its window

Position = tuple[int, int]  # (turn index, step index); step index -1: the turn's user input


def tokens_of(chars: int) -> int:
    return chars // CHARS_PER_TOKEN


def content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def message_chars(message: dict[str, Any]) -> int:
    """The characters of one message the estimate counts."""
    calls = message.get("tool_calls") or []
    return (len(str(message.get("role", ""))) + len(content_text(message.get("content")))
            + sum(len(c["function"]["name"]) + len(c["function"]["arguments"] or "") for c in calls))


def messages_tokens(messages: list[dict[str, Any]]) -> int:
    return tokens_of(sum(message_chars(m) for m in messages))


def compact_at(profile: AgentProfile) -> int | None:
    """The prompt size (tokens) from which the next model call is preceded by a compaction."""
    if not profile.context_window:
        return None
    return int(profile.context_window * profile.compaction_threshold)


@dataclass(frozen=True)
class Cut:
    """A compaction's reach: the history up to ``through`` is replaced by ``summary``."""

    through: Position
    summary: dict[str, Any]


def latest_cut(session_id: Any) -> Cut | None:
    """The newest completed compaction of the session (its summary folds in the older ones)."""
    row = (Step.objects.filter(session_id=session_id, kind=Step.Kind.COMPACTION, status=Step.Status.COMPLETED)
           .order_by("-turn__index", "-index").values_list("arguments", "result").first())
    if row is None:
        return None
    arguments, result = row
    return Cut(through=tuple(arguments["through"]), summary=(result or {}).get("summary") or {})


def _after(position: Position) -> Q:
    turn, index = position
    return Q(turn__index__gt=turn) | Q(turn__index=turn, index__gt=index)


def prompt_estimate(session_id: Any, system_chars: int) -> int:
    """The estimated size (tokens) of the next model call's prompt. Two or three queries, flat in
    the length of the session."""
    from sessions_app.engine.prompt import tool_result_text
    from sessions_app.engine.verification import verification_message

    # A verification is a call of its own, not the agent's prompt: never the basis.
    basis = (Step.objects.filter(session_id=session_id, kind__in=(Step.Kind.MODEL, Step.Kind.COMPACTION),
                                 status=Step.Status.COMPLETED)
             .order_by("-turn__index", "-index").select_related("turn")
             .only("kind", "index", "message", "prompt_tokens", "result", "turn__index").first())
    if basis is None:
        # No call yet: the system prompt and the inputs are all there is.
        inputs = Turn.objects.filter(session_id=session_id).values_list("input", flat=True)
        return tokens_of(system_chars + sum(len(text) + 4 for text in inputs))
    position = (basis.turn.index, basis.index)
    if basis.kind == Step.Kind.COMPACTION:
        tokens = int((basis.result or {}).get("tokens_after", 0))
    else:
        tokens = basis.prompt_tokens + tokens_of(message_chars(basis.message or {}))
    added = sum(len(text) + 4 for text in Turn.objects.filter(
        session_id=session_id, index__gt=position[0]).values_list("input", flat=True))
    for step in Step.objects.filter(_after(position), session_id=session_id,
                                    kind__in=(Step.Kind.TOOL, Step.Kind.VERIFICATION),
                                    status__in=Step.SETTLED).only("kind", "status", "result", "call_id"):
        if step.kind == Step.Kind.TOOL:
            added += len(tool_result_text(step)) + 4
        elif step.status == Step.Status.COMPLETED and not (step.result or {}).get("all_met"):
            added += message_chars(verification_message(step))  # the agent is told what is unmet
    return tokens + tokens_of(added)


@dataclass(frozen=True)
class CompactionRange:
    """What a compaction about to be planned would replace."""

    start: Position    # the first item it replaces
    through: Position  # the last
    items: int


def compaction_range(session_id: Any, keep_recent_steps: int) -> CompactionRange | None:
    """The prefix of the prompt's history (after the previous compaction) to replace, keeping the
    last ``keep_recent_steps`` steps whole; None when nothing older than those is left."""
    previous = latest_cut(session_id)
    floor: Position = previous.through if previous else (-1, -1)
    turns = Turn.objects.filter(session_id=session_id, index__gte=max(floor[0], 0)).values_list("index", flat=True)
    items: list[tuple[Position, str]] = [((t, -1), "input") for t in turns if (t, -1) > floor]
    steps = (Step.objects.filter(_after(floor), session_id=session_id, status__in=Step.SETTLED)
             .filter(Q(kind=Step.Kind.TOOL) | Q(kind=Step.Kind.MODEL, status=Step.Status.COMPLETED))
             .values_list("turn__index", "index", "kind"))
    items += [((t, i), kind) for t, i, kind in steps]
    items.sort()
    kept, first = 0, len(items)
    while first > 0 and kept < keep_recent_steps:
        first -= 1
        kept += items[first][1] != "input"
    while 0 < first < len(items) and items[first][1] == Step.Kind.TOOL:
        first -= 1  # keep the model step whose calls these results answer
    if first <= 0:
        return None
    return CompactionRange(start=items[0][0], through=items[first - 1][0], items=first)
