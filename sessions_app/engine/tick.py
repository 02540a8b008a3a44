"""One engine tick: under the session lock, load the snapshot, ask ``plan.next_action``, apply it.

A tick applies actions until the turn waits, is handed to another worker, or has work claimed for
this one. The session lock serialises every write of the session, so the decision and its claim
are atomic. Celery's ``turn_advance`` (below) runs the in-process tools a tick claims and ticks
again; the model gateway drives turns the same way around its model calls (``gateway.turn_drive``).
"""

import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from agentops import dispatch
from agentops.domain import joins_transaction
from agentops.prepared import Prepared
from approvals_app.models import ApprovalRequest
from sessions_app import hooks
from sessions_app.engine import llm
from sessions_app.engine.budgets import session_counters
from sessions_app.engine.compaction import compaction_arguments
from sessions_app.engine.context import OVERFLOW, CompactionRange, compact_at, compaction_range, prompt_estimate
from sessions_app.engine.hosting import hooks as hosting
from sessions_app.engine.plan import Action, Decision, Snapshot, StepState, next_action
from sessions_app.engine.prompt import system_prompt
from sessions_app.engine.record import TurnStart, step_outcome_record
from sessions_app.engine.tool_steps import (
    StepRebound,
    runs_in_process,
    tool_step_claim,
    tool_step_execute,
    tool_step_gate,
)
from sessions_app.engine.turns import turn_fail, turn_fail_budget
from sessions_app.locks import session_lock_fetch
from sessions_app.models import MODEL_KINDS, SESSION_STATUS_OF_TURN, AgentSession, Step, Turn
from sessions_app.services import (
    step_claim,
    step_create_claimed,
    step_event_payload,
    step_running,
    turn_transition,
)

INLINE_SECONDS = 30.0  # a worker hands the turn to a fresh task after this long


@dataclass
class Claimed:
    """Work this worker claimed in a tick: a model step, or a tool step (with its approval).
    ``session`` and ``turn`` are the rows as the tick read them under the session lock;
    ``no_history``: the claimed model step is the first step of the session's first turn, so its
    prompt is the system prompt and the turn's input alone."""

    step: Step
    session: AgentSession
    approval: ApprovalRequest | None = None
    turn: Turn | None = None
    no_history: bool = False


def _state(step: Step, local: bool = True) -> StepState:
    verification = step.kind == Step.Kind.VERIFICATION
    content = (step.arguments or {}).get("answer") if verification else (step.message or {}).get("content")
    return StepState(id=step.id, index=step.index, status=step.status,
                     leased=step.lease_expires_at is not None,
                     in_process=local and step.kind == Step.Kind.TOOL and runs_in_process(step.tool_name),
                     waits=step.kind == Step.Kind.TOOL and hooks.engine_tool_waits(step.tool_name),
                     content=str(content or ""), kind=step.kind, error_code=step.error_code,
                     met=bool(verification and (step.result or {}).get("all_met")))


@dataclass
class ContextView:
    """The context figures of a snapshot, read only when the model may speak next."""

    tokens: int = 0
    limit: int | None = None
    range: CompactionRange | None = None


def _context(session: AgentSession, last_model: Step | None, tools: list[Step]) -> ContextView:
    limit = compact_at(session.agent)
    overflowed = last_model is not None and last_model.error_code == OVERFLOW
    if (limit is None and not session.compact_requested and not overflowed) or any(
            not t.is_settled for t in tools) or (
            last_model is not None and last_model.status in (Step.Status.PLANNED, Step.Status.RUNNING)):
        return ContextView(limit=limit)
    tokens = prompt_estimate(session.id, len(system_prompt(session)) + 6)
    wanted = overflowed or session.compact_requested or (limit is not None and tokens >= limit)
    rng = compaction_range(session.id, session.agent.keep_recent_steps) if wanted else None
    return ContextView(tokens=tokens, limit=limit, range=rng)


def _snapshot(turn: Turn, session: AgentSession, last_model: Step | None, tools: list[Step], *,
              calls_models: bool, fresh: bool, context: ContextView) -> Snapshot:
    turn_seconds = (timezone.now() - turn.started_at).total_seconds() if turn.started_at else 0.0
    local = hosting.workspace_is_local(session)  # else even list_files goes to the session's host
    return Snapshot(turn_status=turn.status, last_model=_state(last_model) if last_model else None,
                    tools=[_state(t, local) for t in tools], counters=session_counters(session),
                    turn_seconds=turn_seconds,
                    calls_models=calls_models, fresh=fresh, context_tokens=context.tokens, compact_at=context.limit,
                    compactable=context.range is not None, compact_requested=session.compact_requested,
                    has_criteria=bool(session.acceptance_criteria), unmet_rounds=_unmet_rounds(turn, last_model),
                    max_rework=session.agent.verification_rounds)


def _unmet_rounds(turn: Turn, last_model: Step | None) -> int:
    """This turn's verifications that found criteria unmet (read only after one)."""
    if last_model is None or last_model.kind != Step.Kind.VERIFICATION:
        return 0
    return Step.objects.filter(turn=turn, kind=Step.Kind.VERIFICATION, status=Step.Status.COMPLETED,
                               result__all_met=False).count()


def _latest_steps_query(turn_id: uuid.UUID) -> "QuerySet[Step]":
    newest_model = Step.objects.filter(turn_id=turn_id, kind__in=MODEL_KINDS).order_by("-index").values("index")[:1]
    return Step.objects.filter(turn_id=turn_id, index__gte=Coalesce(Subquery(newest_model), -1)).order_by("index")


# The queries of every tick, compiled once (agentops/prepared.py).
_LATEST_STEPS = Prepared(_latest_steps_query)
_TURN = Prepared(lambda pk, session_id: Turn.objects.filter(pk=pk, session_id=session_id))


def _latest_steps(turn: Turn) -> tuple[Step | None, list[Step]]:
    """The turn's newest model-kind step and the tool steps after it, in one query."""
    rows = _LATEST_STEPS.all(turn_id=turn.pk)
    last_model = rows[0] if rows and rows[0].kind in MODEL_KINDS else None
    return last_model, [step for step in rows if step.kind == Step.Kind.TOOL]


@joins_transaction
def turn_tick(turn_id: uuid.UUID | str, *, calls_models: bool = False, fresh: bool = True,
              session_id: uuid.UUID | None = None) -> Claimed | None:
    """Advance the turn as far as it goes without slow work. Returns the work claimed for this
    worker, or None: the turn waits, is over, or was handed to another queue (after commit).
    Joins the caller's transaction (the gateway records a reply and ticks in one)."""
    if session_id is None:
        session_id = Turn.objects.filter(pk=turn_id).values_list("session_id", flat=True).first()
        if session_id is None:
            return None
    session = session_lock_fetch(session_id)
    turn = _TURN.first(pk=uuid.UUID(str(turn_id)), session_id=uuid.UUID(str(session_id)))
    if session is None or turn is None:
        return None
    last_model, tools = _latest_steps(turn)
    _poll_waiting(tools, session)
    while True:
        context = _context(session, last_model, tools) if turn.status in Turn.ACTIVE else ContextView()
        decision = next_action(_snapshot(turn, session, last_model, tools, calls_models=calls_models,
                                         fresh=fresh, context=context))
        if _starts_with_a_model_call(decision, turn, session):
            return _start_claiming_model(decision, turn, session, no_history=last_model is None and not tools)
        if decision.turn_status is not None and turn.status != decision.turn_status:
            turn = turn_transition(turn_id=turn.id, session_id=session.id, to=decision.turn_status, known=turn,
                                   session=session)
        if decision.action == Action.COMPACT:
            assert context.range is not None
            return _compact(decision, turn, session, context)
        if decision.action == Action.VERIFY:
            assert decision.new_index is not None
            rounds = Step.objects.filter(turn=turn, kind=Step.Kind.VERIFICATION).count()
            return _side_call(decision, turn, session, Step.Kind.VERIFICATION,
                              {"answer": decision.output_text, "round": rounds + 1})
        if decision.action != Action.GATE_TOOLS:
            return _apply(decision, turn, session, last_model, tools)
        for step in tools:
            if step.status == Step.Status.PLANNED:
                step.status = tool_step_gate(step=step, session=session)


def _starts_with_a_model_call(decision: Decision, turn: Turn, session: AgentSession) -> bool:
    """A queued turn's first tick that claims a new model step (every new turn's, on PostgreSQL),
    with its session already where a running turn puts it: ``_start_claiming_model`` writes it."""
    return (decision.action == Action.CLAIM_MODEL and decision.step_id is None
            and decision.turn_status == Turn.Status.RUNNING and turn.status == Turn.Status.QUEUED
            and session.status == SESSION_STATUS_OF_TURN[Turn.Status.RUNNING] and connection.vendor == "postgresql")


def _start_claiming_model(decision: Decision, turn: Turn, session: AgentSession, *, no_history: bool) -> Claimed:
    """Start the turn and claim its first model step in one statement (``step_outcome_record``):
    the turn running (``turn.started``), the step inserted claimed (``model.started``). As
    ``turn_transition`` then ``step_create_claimed`` it was four writes: a new turn's first tick
    took 9 statements and ~2.2 ms of a gateway's CPU, a fifth of a gateway's CPU while a burst of
    new sessions started (py-spy, bench/concurrency.py N = 1,000)."""
    assert decision.new_index is not None
    step = step_running(session_id=session.id, turn_id=turn.id, index=decision.new_index, kind=Step.Kind.MODEL,
                        lease_seconds=llm.model_lease_seconds())
    step_outcome_record(session_id=session.id, turn_id=turn.id, turn_start=TurnStart(turn.status), step_inserts=[step],
                        events=[("turn.started", None, {"status": Turn.Status.RUNNING.value, "index": turn.index}),
                                ("model.started", step.id, step_event_payload(step, attempt=step.attempts,
                                                                              arguments=None))])
    turn.status, turn.started_at = Turn.Status.RUNNING, turn.started_at or step.started_at
    return Claimed(step, session, turn=turn, no_history=no_history and turn.index == 1)


def _poll_waiting(tools: list[Step], session: AgentSession) -> None:
    """Ask each engine tool that waits (subagents) whether its work is done (``hooks.ENGINE_TOOLS``)."""
    for step in tools:
        engine_tool = hooks.ENGINE_TOOLS.get(step.tool_name)
        if engine_tool is not None and step.status == Step.Status.RUNNING and step.lease_expires_at is None:
            step.status = engine_tool.poll(step=step, session=session)


def _compact(decision: Decision, turn: Turn, session: AgentSession, context: ContextView) -> Claimed | None:
    """Plan a compaction step with the range it replaces; call it here or hand it to the gateway."""
    assert context.range is not None
    return _side_call(decision, turn, session, Step.Kind.COMPACTION,
                      compaction_arguments(context.range, tokens_before=context.tokens, reason=decision.reason))


def _side_call(decision: Decision, turn: Turn, session: AgentSession, kind: str,
               arguments: dict[str, Any]) -> Claimed | None:
    """Plan a compaction or verification step (a model call with its input fixed in ``arguments``,
    so a re-run after a crash asks the same); call it here or hand it to the gateway."""
    assert decision.new_index is not None
    step = Step.objects.create(session=session, turn=turn, index=decision.new_index, kind=kind, arguments=arguments)
    if not decision.claim:
        dispatch.model_call_enqueue(step.id, turn_id=turn.id, session_id=session.id)
        return None
    claimed = step_claim(step_id=step.id, from_status=Step.Status.PLANNED, lease_seconds=llm.model_lease_seconds(),
                         event_type=f"{kind}.started", known=step)
    return Claimed(claimed, session) if claimed else None


def _apply(decision: Decision, turn: Turn, session: AgentSession, last_model: Step | None,
           tools: list[Step]) -> Claimed | None:
    """Do what the decision says, inside the tick's transaction."""
    match decision.action:
        case Action.FINISHED | Action.WAIT:
            return None
        case Action.FAIL_CONTEXT:
            turn_fail(turn_id=turn.id, code="context_overflow",
                      message="The prompt exceeds the model's context window and nothing older is left to compact "
                              "(the pinned context and the recent steps alone are too large).")
            return None
        case Action.FAIL_BUDGET:
            assert decision.budget is not None
            turn_fail_budget(turn_id=turn.id, session_id=session.id, budget=decision.budget)
            return None
        case Action.COMPLETE_TURN:
            verified = last_model is not None and last_model.kind == Step.Kind.VERIFICATION
            verdicts = (last_model.result or {}).get("verdicts") if verified and last_model else None
            turn_transition(turn_id=turn.id, session_id=session.id, to=Turn.Status.COMPLETED, known=turn,
                            session=session, output_text=decision.output_text, verdicts=verdicts,
                            criteria_unmet=decision.criteria_unmet)
            if session.criteria_unmet != decision.criteria_unmet:
                AgentSession.objects.filter(pk=session.id).update(criteria_unmet=decision.criteria_unmet)
            return None
        case Action.CLAIM_MODEL:
            if decision.step_id is None:
                assert decision.new_index is not None
                step = step_create_claimed(session_id=session.id, turn_id=turn.id, index=decision.new_index,
                                           kind=Step.Kind.MODEL, lease_seconds=llm.model_lease_seconds(),
                                           event_type="model.started")
                return Claimed(step, session, turn=turn,
                               no_history=turn.index == 1 and last_model is None and not tools)
            assert last_model is not None
            started = f"{last_model.kind}.started"
            claimed = step_claim(step_id=last_model.id, from_status=Step.Status.PLANNED,
                                 lease_seconds=llm.model_lease_seconds(), event_type=started, known=last_model)
            return Claimed(claimed, session, turn=turn) if claimed else None
        case Action.ENQUEUE_MODEL:
            step_id = decision.step_id
            if step_id is None:
                assert decision.new_index is not None
                step_id = Step.objects.create(session=session, turn=turn, index=decision.new_index,
                                              kind=Step.Kind.MODEL).id
            dispatch.model_call_enqueue(step_id, turn_id=turn.id, session_id=session.id)
            return None
        case Action.CLAIM_TOOL:
            step = next(t for t in tools if t.id == decision.step_id)
            try:
                return Claimed(step, session, tool_step_claim(step))
            except StepRebound:
                return None  # the approval no longer covered the call: a reviewer is asked again
        case Action.ENQUEUE_TOOL:
            assert decision.step_id is not None
            dispatch.tool_run_enqueue(decision.step_id)
            return None
        case Action.HAND_OVER:
            dispatch.tick_enqueue(turn.id)
            return None
    raise AssertionError(f"unhandled {decision.action}")


def turn_advance(turn_id: uuid.UUID | str) -> None:
    """Drive a turn from a Celery worker until it waits or is handed off: tick, run the in-process
    tool the tick claimed, tick again. Model calls go to the gateway (this worker claims none)."""
    started = time.monotonic()
    session_id: uuid.UUID | None = None
    while True:
        fresh = time.monotonic() - started <= INLINE_SECONDS
        claimed = turn_tick(turn_id, fresh=fresh, session_id=session_id)
        if claimed is None:
            return
        session_id = claimed.session.id
        tool_step_execute(claimed.step, claimed.approval, claimed.session)
