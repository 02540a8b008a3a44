"""The inline path: a model reply whose tool calls are all read-only runs them at once, in the
worker that holds the turn, and records everything in one statement.

An agent that reads 400 files in a row needs no hop between workers, no re-read of its history
before each model call, and no transaction per event. The worker that claimed the model step
keeps the conversation in memory. When a reply asks only for read-only tools that need no
sandbox (``safe_readonly``, idempotent, in-process: ``list_files``, ``read_file``), it runs
them, then writes in one transaction, one statement (``session_record``):

    the model step completed, its tool steps (completed or failed, with their results), their
    events (model.completed, tool.started, tool.completed …, model.started), the counters, and
    the next model step, claimed by this worker with a lease.

Why the tool steps need no claim before they run: a read-only tool has no effect to protect,
so exactly-once does not matter, at-least-once does. Until the commit the model step holds its
lease; a worker lost before it leaves that step to the sweeper, which re-runs the model call
(no side effects) and so the tools, as on the general path. A step cancelled meanwhile fails
the write's conditional update and nothing is recorded.

Anything else leaves the inline path with the reply recorded the usual way, and ``decide()``
takes over: a tool that is not read-only, needs the sandbox queue, is unknown, disabled or a
client tool; invalid arguments; the final answer; a budget the calls would cross; a published
file; counters someone else moved; the inline time limit.
"""

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentops.domain import InvalidTransition
from sessions_app.engine import llm, tools
from sessions_app.engine.state import budget_exceeded, session_counters, worker_id
from sessions_app.models import AgentSession, Step, Turn
from sessions_app.services import COUNTERS, StepChange, session_record
from tools_app.builtin import BUILTIN_TOOLS, execute_tool, validate_arguments
from tools_app.models import ApprovalMode, ToolDefinition
from tools_app.selectors import tool_definitions_by_name

log = logging.getLogger(__name__)


class _Handover(Exception):
    """Roll the inline write back: the general path records this reply instead."""


@dataclass
class Conversation:
    """What the worker holding a turn knows, kept current by its own writes."""

    session: AgentSession
    turn_started_at: datetime | None
    messages: list[dict[str, Any]]
    counters: dict[str, Any]
    deadline: float

    @classmethod
    def load(cls, step: Step, *, deadline: float) -> "Conversation":
        """Read the session and rebuild the history once, for a model step this worker claimed."""
        session = AgentSession.objects.select_related("agent").get(pk=step.session_id)
        started_at = Turn.objects.values_list("started_at", flat=True).get(pk=step.turn_id)
        return cls(session=session, turn_started_at=started_at, messages=llm.build_messages(session),
                   counters=session_counters(session), deadline=deadline)

    def in_time(self) -> bool:
        return time.monotonic() < self.deadline


def inline_tool(name: str, arguments: dict[str, Any], error: str, session: AgentSession) -> ToolDefinition | None:
    """The tool's definition when this call may run here, now, without asking anyone; else None."""
    tool = tool_definitions_by_name().get(name)
    builtin = BUILTIN_TOOLS.get(name)
    if (error or tool is None or builtin is None or builtin.needs_sandbox or not tool.enabled
            or tool.kind != ToolDefinition.Kind.BUILTIN or tool.approval_mode != ApprovalMode.SAFE_READONLY
            or not tool.idempotent or name not in tools.allowed_tool_names(session.agent)):
        return None
    return None if validate_arguments(name, tool.parameters_schema, arguments) else tool


@dataclass
class _Ran:
    step: Step
    payload: dict[str, Any]
    ok: bool


def _run_tool(convo: Conversation, step: Step, tool: ToolDefinition) -> _Ran:
    workspace = tools.session_workspace(convo.session)
    result = execute_tool(name=step.tool_name, workspace=workspace, arguments=step.arguments,
                          timeout_seconds=tool.timeout_seconds, network="none",
                          idempotency_key=step.idempotency_key, should_cancel=lambda: False)
    tools.failpoint_after_tool(step.tool_name)
    payload = result.to_dict()
    ok = payload.get("status") == "completed"
    step.status = Step.Status.COMPLETED if ok else Step.Status.FAILED
    step.result, step.finished_at = payload, timezone.now()
    step.error_code = "" if ok else str(payload.get("error_code", "tool_error"))
    step.error_message = "" if ok else str(payload.get("error_message", ""))[:2000]
    return _Ran(step, payload, ok)


def _predicted(counters: dict[str, Any], **add: int) -> dict[str, Any]:
    return {**counters, **{name: counters[name] + add.get(name, 0) for name in COUNTERS}}


def model_step_run(convo: Conversation, step: Step) -> Step | None:
    """Call the model for a claimed model step and record the reply. Returns the next model step,
    claimed by this worker, when the reply's read-only tools ran inline; None: ``decide()`` goes on."""
    try:
        reply = llm.call_model(step, session=convo.session, messages=convo.messages)
    except llm.ModelCallFailed as exc:
        llm.record_failure(step, exc)
        return None
    message = llm.assistant_message(reply)
    calls = llm.planned_calls(message)
    defs = [inline_tool(name, arguments, error, convo.session) for name, _, arguments, error in calls]
    after_reply = _predicted(convo.counters, model_calls=1, prompt_tokens=reply.prompt_tokens,
                             completion_tokens=reply.completion_tokens)
    limit = after_reply["max_tool_calls"]
    if (not calls or None in defs or not convo.in_time()
            or (limit is not None and after_reply["tool_calls"] + len(calls) > limit)
            or budget_exceeded(after_reply, convo.turn_started_at, before="tool")):
        _record_reply(step, reply, message)
        return None

    replied_at = timezone.now()
    ran = []
    for i, ((name, call_id, arguments, _), tool) in enumerate(zip(calls, defs, strict=True), start=1):
        assert tool is not None
        tool_step = Step(session_id=step.session_id, turn_id=step.turn_id, index=step.index + i, kind=Step.Kind.TOOL,
                         tool_name=name, call_id=call_id, arguments=arguments, approval_mode=tool.approval_mode,
                         idempotency_key=f"{step.turn_id}:{call_id}", attempts=1, started_at=timezone.now())
        ran.append(_run_tool(convo, tool_step, tool))
    if any(r.payload.get("published_files") for r in ran):
        _record_reply(step, reply, message)  # artifacts are stored by the general path
        return None

    predicted = _predicted(after_reply, tool_calls=len(ran))
    now = timezone.now()
    next_step = None
    if not budget_exceeded(predicted, convo.turn_started_at, before="model"):
        next_step = Step(session_id=step.session_id, turn_id=step.turn_id, index=step.index + len(ran) + 1,
                         kind=Step.Kind.MODEL, status=Step.Status.RUNNING, lease_owner=worker_id(),
                         lease_expires_at=now + timedelta(seconds=llm.model_lease_seconds()), attempts=1,
                         started_at=now)
    events: list[tuple[str, Any, dict[str, Any]]] = [
        ("model.completed", step.id, llm.reply_event_payload(step, message, reply))]
    for r in ran:
        events.append(("tool.started", r.step.id, _started_payload(r.step)))
        events.append(("tool.completed" if r.ok else "tool.failed", r.step.id,
                       {"status": r.step.status, "index": r.step.index, "kind": r.step.kind,
                        "tool": r.step.tool_name, "result": tools.event_result(r.payload)}))
    if next_step is not None:
        events.append(("model.started", next_step.id, _started_payload(next_step)))
    try:
        with transaction.atomic():
            counters = session_record(
                session_id=step.session_id, turn_id=step.turn_id, events=events,
                # A step settled meanwhile (cancelled, failed) is not ours to record.
                step_changes=[StepChange(step.id, Step.Status.RUNNING, {
                    "status": Step.Status.COMPLETED, "message": message, "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens, "finished_at": replied_at, "lease_owner": "",
                    "lease_expires_at": None})],
                step_inserts=[r.step for r in ran] + ([next_step] if next_step is not None else []),
                model_calls=1, tool_calls=len(ran), prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens)
            # The budgets were checked against what this worker knew; anyone else's write voids that.
            if counters is None or counters.pop("steps_changed") != 1 or counters != predicted:
                raise _Handover
    except _Handover:
        _record_reply(step, reply, message)
        return None
    convo.counters = counters
    convo.messages.append(message)
    convo.messages.extend({"role": "tool", "tool_call_id": r.step.call_id, "content": llm.tool_result_text(r.step)}
                          for r in ran)
    return next_step


def _started_payload(step: Step) -> dict[str, Any]:
    return {"status": "running", "index": step.index, "kind": step.kind, "tool": step.tool_name,
            "attempt": step.attempts, "arguments": step.arguments if step.kind == Step.Kind.TOOL else None}


def _record_reply(step: Step, reply: llm.ModelReply, message: dict[str, Any]) -> None:
    """The general path's record of a reply; a step settled meanwhile keeps its end."""
    try:
        llm.record_reply(step=step, reply=reply, message=message)
    except InvalidTransition:
        log.info("model step %s was settled meanwhile (cancelled?); its reply is dropped", step.id)


def run(step: Step, *, deadline: float) -> None:
    """Drive a model step this worker claimed, and the model steps that follow read-only tool
    calls, until ``decide()`` must take over."""
    convo = Conversation.load(step, deadline=deadline)
    current: Step | None = step
    while current is not None:
        current = model_step_run(convo, current)
