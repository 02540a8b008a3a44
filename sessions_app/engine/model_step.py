"""A claimed model step: call the model, record the reply, and keep going while the reply asks
only for read-only tools.

The worker that claimed the model step keeps the conversation in memory. When a reply asks only
for tools that are read-only, in-process and valid (``safe_readonly``, idempotent, no sandbox:
``list_files``, ``read_file``), it runs them at once and records everything with one write
(``record.step_outcome_record``): the model step completed, its tool steps with their results,
their events, the counters, and the next model step, claimed by this worker with a lease. An agent
that reads 400 files in a row needs no hop between workers and no re-read of its history.

Those tool steps need no claim before they run: a read-only call has no effect to protect. Until
the commit the model step holds its lease; a worker lost before it leaves that step to the
sweeper, which re-runs the model call and so the tools. A step cancelled meanwhile fails the
write's conditional update and nothing is recorded.

Any other reply is recorded on its own (``model_reply_record``) and the tick takes over.

Everything here is synchronous database work; the gateway runs it in its database threads, around
the model call it awaits on its event loop.
"""

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentops.domain import InvalidTransition, joins_transaction
from sessions_app.engine import llm
from sessions_app.engine.budgets import budget_crossed, session_counters
from sessions_app.engine.context import OVERFLOW, compact_at, message_chars, tokens_of
from sessions_app.engine.hosting import hooks as hosting
from sessions_app.engine.prompt import build_messages, system_prompt, tool_message
from sessions_app.engine.record import COUNTERS, EventSpec, StepChange, step_outcome_record
from sessions_app.engine.tick import Claimed, turn_tick
from sessions_app.engine.tool_steps import (
    event_result,
    failpoint_after_tool,
    runs_in_process,
    session_workspace,
    tool_available,
)
from sessions_app.engine.turns import turn_fail
from sessions_app.models import AgentSession, Step, Turn
from sessions_app.services import step_event_payload, step_result_dropped, step_running, step_transition
from tools_app.builtin import execute_tool, validate_arguments
from tools_app.models import ApprovalMode, ToolDefinition
from tools_app.selectors import tool_definitions_by_name
from vault_app.resolve import team_redactor_cached

log = logging.getLogger(__name__)


class _HandOver(Exception):
    """Roll the one-write record back: the reply is recorded on its own instead."""


@dataclass
class Conversation:
    """What the worker holding a turn knows, kept current by its own writes."""

    session: AgentSession
    turn_started_at: datetime | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    counters: dict[str, Any]
    deadline: float
    # The session's workspace path is stored (else the next inline write stores it).
    workspace_saved: bool = True

    @classmethod
    def load(cls, step: Step, *, deadline: float, known: "Claimed | None" = None) -> "Conversation":
        """Read the session and rebuild the history once, for a model step this worker claimed.
        ``known``: the tick's claim, whose session and turn were read under the lock just now (not
        read again); when it says the turn has no history, none is read."""
        if known is not None and known.turn is not None:
            session, started_at = known.session, known.turn.started_at
        else:
            session = AgentSession.objects.select_related("agent").get(pk=step.session_id)
            started_at = Turn.objects.values_list("started_at", flat=True).get(pk=step.turn_id)
        if known is not None and known.no_history and known.turn is not None:
            messages = [{"role": "system", "content": system_prompt(session)},
                        {"role": "user", "content": known.turn.input}]
        else:
            messages = build_messages(session)
        return cls(session=session, turn_started_at=started_at, messages=messages,
                   tools=llm.tools_param(session.agent, (session.metadata or {}).get("agentops_tools")),
                   counters=session_counters(session), deadline=deadline, workspace_saved=bool(session.workspace))

    def in_time(self) -> bool:
        return time.monotonic() < self.deadline

    def turn_seconds(self) -> float:
        return (timezone.now() - self.turn_started_at).total_seconds() if self.turn_started_at else 0.0


def _runs_inline(name: str, arguments: dict[str, Any], error: str, session: AgentSession) -> ToolDefinition | None:
    """The tool's definition when this call may run here, now, without asking anyone; else None."""
    tool = None if error else tool_available(session, name)
    if (tool is None or not runs_in_process(name) or not hosting.workspace_is_local(session)
            or tool.kind != ToolDefinition.Kind.BUILTIN
            or tool.approval_mode != ApprovalMode.SAFE_READONLY or not tool.idempotent):
        return None
    return None if validate_arguments(name, tool.parameters_schema, arguments) else tool


# --- recording a reply on its own ------------------------------------------------------------

class StepSettled(InvalidTransition):
    """The model step was settled elsewhere meanwhile (cancelled)."""


def _delta_events(step: Step, reply: llm.ModelReply) -> list[EventSpec]:
    """The streamed text the call held back (its last ``model.delta``), recorded with the reply."""
    return [("model.delta", step.id, {"text": reply.held_delta})] if reply.held_delta else []


@joins_transaction
def model_reply_record(*, step: Step, reply: llm.ModelReply, message: dict[str, Any]) -> None:
    """Store the assistant message, its usage and its planned tool steps (the tick gates them), in
    one statement (``record.step_outcome_record``). Raises ``StepSettled`` (409) when the step is
    no longer running (cancelled meanwhile): the caller's transaction must then roll back."""
    modes = {name: tool.approval_mode for name, tool in tool_definitions_by_name().items()}
    checks = reply.checks or {}
    planned = [Step(session_id=step.session_id, turn_id=step.turn_id, index=step.index + i, kind=Step.Kind.TOOL,
                    tool_name=name, call_id=call_id, arguments=arguments, error_message=error,
                    error_code="invalid_arguments" if error else "", checks=checks.get(call_id),
                    approval_mode=modes.get(name, ApprovalMode.MUTATING),
                    idempotency_key=f"{step.turn_id}:{call_id}")
               for i, (name, call_id, arguments, error) in enumerate(llm.planned_calls(message), start=1)]
    events = [*_delta_events(step, reply), ("model.completed", step.id, step_event_payload(
        step, status=Step.Status.COMPLETED, **llm.reply_event_fields(message, reply)))]
    counters = step_outcome_record(
        session_id=step.session_id, turn_id=step.turn_id, events=events,
        step_changes=[StepChange(step.id, Step.Status.RUNNING, Step.Status.COMPLETED, {
            "message": message, "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "finished_at": timezone.now(), "lease_owner": "", "lease_expires_at": None})],
        step_inserts=planned, model_calls=1,
        # the prohibitions check counts in the session's and the turn's tokens too
        prompt_tokens=reply.prompt_tokens + reply.check_prompt_tokens,
        completion_tokens=reply.completion_tokens + reply.check_completion_tokens)
    if counters is None or counters["steps_changed"] != 1:
        raise StepSettled(f"Model step {step.id} is no longer running; its reply is not recorded")


def _reply_record_and_tick(step: Step, reply: llm.ModelReply, message: dict[str, Any], *,
                           fresh: bool) -> Claimed | None:
    """Record the reply on its own and tick the turn in the same transaction (one commit, and no
    moment when the reply is stored but the turn not driven on). Returns the tick's claim. A step
    settled meanwhile (cancelled) keeps its end: the reply is dropped, and the timeline says so."""
    try:
        with transaction.atomic():
            model_reply_record(step=step, reply=reply, message=message)
            return turn_tick(step.turn_id, calls_models=True, fresh=fresh, session_id=step.session_id)
    except StepSettled:
        log.info("model step %s was settled meanwhile (cancelled?); its reply is dropped", step.id)
        step_result_dropped(step, "model.reply_dropped")
    return turn_tick(step.turn_id, calls_models=True, fresh=fresh, session_id=step.session_id)


def model_failure_record(step: Step, exc: llm.ModelCallFailed) -> None:
    """The model call of a claimed step failed for good: fail the step and its turn. A prompt over
    the provider's window fails only the step the first time: the tick compacts and calls again;
    the second time (right after that compaction) the turn fails with ``context_overflow``."""
    code, message = exc.code, exc.message
    with transaction.atomic():
        step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.FAILED,
                        event_type="model.failed", event_payload={"error_code": code, "error": message[:500]},
                        error_code=code, error_message=message[:2000])
        if code == OVERFLOW:
            if step.kind == Step.Kind.MODEL and not _after_overflow_compaction(step):
                return
            code, message = "context_overflow", f"The prompt still exceeds the model's context window after " \
                                                f"compacting: {message}"
        elif step.kind == Step.Kind.COMPACTION:
            if (step.arguments or {}).get("reason") != "overflow":
                # Compacting ahead of the window (its threshold, or an operator's ask) is an
                # optimisation: the prompt still fits, so the turn goes on with the full history (the
                # planner never compacts twice in a row). It failed the turn before, not retryable
                # on a 400, and said nothing of the compaction.
                return
            message = f"The compaction call failed (the prompt does not fit the model's window without it): {message}"
        turn_fail(turn_id=step.turn_id, code=code, message=message, retryable=exc.retryable)


def _after_overflow_compaction(step: Step) -> bool:
    return Step.objects.filter(turn_id=step.turn_id, index=step.index - 1, kind=Step.Kind.COMPACTION,
                               arguments__reason="overflow").exists()


# --- the inline path ---------------------------------------------------------------------------

@dataclass
class _Ran:
    step: Step
    result: dict[str, Any]
    ok: bool


def _run_read_only(convo: Conversation, step: Step, tool: ToolDefinition) -> _Ran:
    """Run an unsaved read-only tool step and settle it in memory."""
    workspace = session_workspace(convo.session, persist=False)  # stored by the write that records this step
    result = execute_tool(name=step.tool_name, workspace=workspace, arguments=step.arguments,
                          timeout_seconds=tool.timeout_seconds, network="none",
                          idempotency_key=step.idempotency_key, should_cancel=lambda: False).to_dict()
    result = team_redactor_cached(convo.session.team_id).value(result)  # a file may hold a secret
    failpoint_after_tool(step.tool_name)
    ok = result.get("status") == "completed"
    step.status = Step.Status.COMPLETED if ok else Step.Status.FAILED
    step.result, step.finished_at = result, timezone.now()
    step.error_code = "" if ok else str(result.get("error_code", "tool_error"))
    step.error_message = "" if ok else str(result.get("error_message", ""))[:2000]
    return _Ran(step, result, ok)


def _plus(counters: dict[str, Any], **add: int) -> dict[str, Any]:
    return {**counters, **{name: counters[name] + add.get(name, 0) for name in COUNTERS}}


@dataclass
class Ticked:
    """The reply was recorded on its own and the turn ticked: the work that tick claimed, if any."""

    claimed: Claimed | None


def model_reply_apply(convo: Conversation, step: Step, reply: llm.ModelReply, *, fresh: bool = True) -> Step | Ticked:
    """Record the reply of a claimed model step. Returns the next model step, claimed by this
    worker, when the reply's read-only tools ran inline; else the reply is recorded on its own and
    the turn ticked in the same transaction (``fresh``: the tick's, see ``turn_tick``)."""
    message = llm.assistant_message(reply)
    calls = llm.planned_calls(message)
    tools = [_runs_inline(name, arguments, error, convo.session) for name, _, arguments, error in calls]
    after_reply = _plus(convo.counters, model_calls=1, prompt_tokens=reply.prompt_tokens,
                        completion_tokens=reply.completion_tokens)
    limit = after_reply["max_tool_calls"]
    if (not calls or None in tools or reply.checks or not fresh or not convo.in_time()
            or (limit is not None and after_reply["tool_calls"] + len(calls) > limit)
            or budget_crossed(after_reply, convo.turn_seconds(), before="tool")):
        return Ticked(_reply_record_and_tick(step, reply, message, fresh=fresh))

    replied_at = timezone.now()
    ran = []
    for i, ((name, call_id, arguments, _), tool) in enumerate(zip(calls, tools, strict=True), start=1):
        assert tool is not None
        tool_step = Step(session_id=step.session_id, turn_id=step.turn_id, index=step.index + i, kind=Step.Kind.TOOL,
                         tool_name=name, call_id=call_id, arguments=arguments, approval_mode=tool.approval_mode,
                         idempotency_key=f"{step.turn_id}:{call_id}", attempts=1, started_at=timezone.now())
        ran.append(_run_read_only(convo, tool_step, tool))
    if any(r.result.get("published_files") for r in ran):  # artifacts are stored by the general path
        return Ticked(_reply_record_and_tick(step, reply, message, fresh=fresh))

    predicted = _plus(after_reply, tool_calls=len(ran))
    next_step = None
    if not budget_crossed(predicted, convo.turn_seconds(), before="model") and not _nears_window(
            convo, reply, message, ran):
        next_step = step_running(session_id=step.session_id, turn_id=step.turn_id, index=step.index + len(ran) + 1,
                                 kind=Step.Kind.MODEL, lease_seconds=llm.model_lease_seconds())
    events: list[EventSpec] = [*_delta_events(step, reply), (
        "model.completed", step.id, step_event_payload(step, status=Step.Status.COMPLETED,
                                                       **llm.reply_event_fields(message, reply)))]
    for r in ran:
        events.append(("tool.started", r.step.id, _started_payload(r.step)))
        events.append(("tool.completed" if r.ok else "tool.failed", r.step.id,
                       step_event_payload(r.step, result=event_result(r.result))))
    if next_step is not None:
        events.append(("model.started", next_step.id, _started_payload(next_step)))
    try:
        with transaction.atomic():
            counters = step_outcome_record(
                session_id=step.session_id, turn_id=step.turn_id, events=events,
                step_changes=[StepChange(step.id, Step.Status.RUNNING, Step.Status.COMPLETED, {
                    "message": message, "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens, "finished_at": replied_at, "lease_owner": "",
                    "lease_expires_at": None})],
                step_inserts=[r.step for r in ran] + ([next_step] if next_step is not None else []),
                model_calls=1, tool_calls=len(ran), prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                workspace=None if convo.workspace_saved else convo.session.workspace)
            # The budgets were checked against what this worker knew; anyone else's write voids that.
            if counters is None or counters.pop("steps_changed") != 1 or counters != predicted:
                raise _HandOver
    except _HandOver:
        return Ticked(_reply_record_and_tick(step, reply, message, fresh=fresh))
    convo.counters, convo.workspace_saved = counters, True
    convo.messages.append(message)
    convo.messages.extend(tool_message(r.step) for r in ran)
    if next_step is None:
        return Ticked(turn_tick(step.turn_id, calls_models=True, fresh=fresh, session_id=step.session_id))
    return next_step


def _nears_window(convo: Conversation, reply: llm.ModelReply, message: dict[str, Any], ran: list[_Ran]) -> bool:
    """The next prompt would cross the compaction threshold (``context.py``'s estimate): the next
    call is not claimed here, the tick decides (and compacts first)."""
    limit = compact_at(convo.session.agent)
    if limit is None:
        return False
    added = message_chars(message) + sum(message_chars(tool_message(r.step)) for r in ran)
    return reply.prompt_tokens + tokens_of(added) >= limit


def _started_payload(step: Step) -> dict[str, Any]:
    return step_event_payload(step, status=Step.Status.RUNNING, attempt=step.attempts,
                              arguments=step.arguments if step.kind == Step.Kind.TOOL else None)
