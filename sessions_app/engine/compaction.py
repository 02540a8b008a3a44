"""The compaction step: a model call that folds the older history into a structured summary.

It is a step like a model call (``Step.Kind.COMPACTION``): planned by the tick (``plan`` says
COMPACT) with the range it replaces fixed in its ``arguments``, claimed with a lease, called by
the gateway, recorded by a conditional update that only the lease holder's write passes (so a
compaction re-run after a crash is applied once), and retried by the sweeper like a model call.
Nothing is deleted: the prompt skips what the summary replaces (``prompt.build_messages``); the
timeline keeps every step and shows the compaction as a card (event ``session.compacted``).

The request: a system message carrying ``COMPACTION_MARKER`` and the instructions, and one user
message with the previous summary and the replaced history as a transcript (``### <role>``
headers; tool outputs capped at ``TRANSCRIPT_TOOL_CHARS``, so a compaction's own prompt stays
far below the window).
"""

import json
import logging
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agentops.domain import joins_transaction
from sessions_app.engine import llm
from sessions_app.engine.context import (
    CompactionRange,
    Cut,
    content_text,
    messages_tokens,
)
from sessions_app.engine.prompt import build_messages, system_prompt, tool_result_text
from sessions_app.events import event_record
from sessions_app.locks import session_lock
from sessions_app.models import AgentSession, Step, Turn
from sessions_app.services import step_event_payload

log = logging.getLogger(__name__)

COMPACTION_MARKER = "[[agentops:compaction]]"
SUMMARY_KEYS = ("goal", "decisions", "facts", "files", "open_questions", "tried_and_failed")
TRANSCRIPT_TOOL_CHARS = 2000
INSTRUCTIONS = (
    f"{COMPACTION_MARKER} You compress an agent's working history so it can keep working within its "
    "context window. Fold the previous summary and the transcript into one summary. Answer with one JSON "
    "object and nothing else, with the keys: " + ", ".join(SUMMARY_KEYS) + ". `goal` is a string; every other "
    "key is a list of short strings. Keep every fact, decision and file path the agent will need; drop chatter."
)


def compaction_arguments(rng: CompactionRange, *, tokens_before: int, reason: str) -> dict[str, Any]:
    """What a planned compaction step holds: fixed when it is planned, so a re-run replaces the same range."""
    return {"start": list(rng.start), "through": list(rng.through), "items": rng.items,
            "tokens_before": tokens_before, "reason": reason}


def _render_assistant(message: dict[str, Any]) -> str:
    parts = [content_text(message.get("content"))] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        parts.append(f"calls {call['function']['name']}({call['function']['arguments']}) [{call['id']}]")
    return "\n".join(parts)


def compaction_request(step: Step) -> tuple[AgentSession, list[dict[str, Any]]]:
    """The session (with its agent) and the messages of a claimed compaction step's call."""
    session = AgentSession.objects.select_related("agent").get(pk=step.session_id)
    start, through = tuple(step.arguments["start"]), tuple(step.arguments["through"])
    own_turn = Turn.objects.values_list("index", flat=True).get(pk=step.turn_id)
    previous = (Step.objects.filter(session_id=step.session_id, kind=Step.Kind.COMPACTION,
                                    status=Step.Status.COMPLETED)
                .filter(Q(turn__index__lt=own_turn) | Q(turn__index=own_turn, index__lt=step.index))
                .order_by("-turn__index", "-index").values_list("result", flat=True).first())
    names: dict[str, str] = {}
    lines: list[str] = []
    turns = Turn.objects.filter(session_id=step.session_id, index__gte=start[0], index__lte=through[0])
    in_range = (Q(turn__index__gt=start[0]) | Q(turn__index=start[0], index__gte=start[1])) & (
        Q(turn__index__lt=through[0]) | Q(turn__index=through[0], index__lte=through[1]))
    by_turn: dict[int, list[Step]] = {}
    # Only the replaced range: a turn of a thousand steps is not read whole at every compaction.
    for s in (Step.objects.filter(in_range, session_id=step.session_id, status__in=Step.SETTLED)
              .exclude(kind=Step.Kind.COMPACTION).select_related("turn").order_by("index")):
        by_turn.setdefault(s.turn.index, []).append(s)
    for index, text in turns.order_by("index").values_list("index", "input"):
        if start <= (index, -1) <= through:
            lines.append(f"### user (turn {index})\n{text}")
        for s in by_turn.get(index, []):
            if s.kind == Step.Kind.MODEL and s.status == Step.Status.COMPLETED and s.message:
                for call in s.message.get("tool_calls") or []:
                    names[call["id"]] = call["function"]["name"]
                lines.append(f"### assistant\n{_render_assistant(s.message)}")
            elif s.kind == Step.Kind.TOOL:
                text = tool_result_text(s)
                if len(text) > TRANSCRIPT_TOOL_CHARS:
                    text = text[:TRANSCRIPT_TOOL_CHARS] + f"\n[… {len(text) - TRANSCRIPT_TOOL_CHARS} more characters]"
                lines.append(f"### tool {names.get(s.call_id, s.tool_name)} [{s.call_id}]\n{text}")
    prior = json.dumps((previous or {}).get("summary") or {}, ensure_ascii=False)
    user = f"Previous summary:\n{prior}\n\nTranscript to fold in:\n" + "\n\n".join(lines)
    # The pinned context rides along verbatim, so the summary is written against it (and every
    # request the agent makes carries it), but is never summarised: it stays in every prompt.
    system = f"{INSTRUCTIONS}\n\nThe agent's own instructions and pinned context, for reference (never " \
             f"summarise or restate them):\n{system_prompt(session)}"
    return session, [{"role": "system", "content": system}, {"role": "user", "content": user}]


def summary_parse(text: str) -> dict[str, Any]:
    """The summary object of a reply: its JSON (or the outermost ``{…}`` in it); else the text."""
    for candidate in (text, text[text.find("{"):text.rfind("}") + 1]):
        try:
            value = json.loads(candidate)
        except (json.JSONDecodeError, ValueError):
            continue
        if isinstance(value, dict):
            return value
    return {"goal": "", "text": text.strip()}


@joins_transaction
def compaction_record(step: Step, reply: llm.ModelReply) -> bool:
    """Record a claimed compaction's summary. Only the lease holder's write applies (a compaction
    re-run after its lease expired, or one cancelled meanwhile, records nothing): False then."""
    session_lock(step.session_id)
    summary = summary_parse(reply.content)
    session = AgentSession.objects.select_related("agent").get(pk=step.session_id)
    tokens_after = messages_tokens(build_messages(session, cut=Cut(tuple(step.arguments["through"]), summary)))
    result = {"summary": summary, "tokens_before": int(step.arguments.get("tokens_before", 0)),
              "tokens_after": tokens_after, "start": step.arguments["start"], "through": step.arguments["through"]}
    now = timezone.now()
    applied = Step.objects.filter(pk=step.pk, status=Step.Status.RUNNING, lease_owner=step.lease_owner).update(
        status=Step.Status.COMPLETED, result=result, prompt_tokens=reply.prompt_tokens,
        completion_tokens=reply.completion_tokens, finished_at=now, lease_owner="", lease_expires_at=None,
        updated_at=now)
    if not applied:
        log.info("compaction step %s was settled or re-claimed meanwhile; its summary is dropped", step.id)
        return False
    step.status, step.result = Step.Status.COMPLETED, result
    AgentSession.objects.filter(pk=step.session_id).update(
        compact_requested=False, model_calls=F("model_calls") + 1,
        prompt_tokens=F("prompt_tokens") + reply.prompt_tokens,
        completion_tokens=F("completion_tokens") + reply.completion_tokens)
    Turn.objects.filter(pk=step.turn_id).update(prompt_tokens=F("prompt_tokens") + reply.prompt_tokens,
                                                 completion_tokens=F("completion_tokens") + reply.completion_tokens)
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="session.compacted",
                 payload=step_event_payload(step, **result, reason=step.arguments.get("reason", ""),
                                            usage={"prompt_tokens": reply.prompt_tokens,
                                                   "completion_tokens": reply.completion_tokens}))
    return True


def compaction_record_atomic(step: Step, reply: llm.ModelReply) -> bool:
    with transaction.atomic():
        return compaction_record(step, reply)

