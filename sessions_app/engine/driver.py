"""One engine tick: lock the session, decide the one next action, claim it, do it or hand it off.

A model step claimed on the llm queue runs through ``inline.run``: a reply that asks only for
read-only tools that need no sandbox runs them at once, is recorded in one write and the next
model call follows in the same task. A task ends where the design needs it: a sandboxed command
(queue ``sandbox``), a model call (queue ``llm``, unless we are already on it), an approval, a
client tool, a budget, or the inline limit (then it re-enqueues itself).
"""

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from sessions_app.engine import inline, llm, tools
from sessions_app.engine.state import (
    budget_exceeded,
    session_counters,
    step_claim,
    step_create_claimed,
    turn_fail,
    turn_move,
)
from sessions_app.models import AgentSession, Step, Turn
from sessions_app.services import event_record, session_lock_fetch

log = logging.getLogger(__name__)

INLINE_SECONDS = 30.0  # a tick hands over to a fresh task after this long


@dataclass
class Next:
    """What the tick decided: nothing to do here (done, wait), work claimed for this worker
    (model_claimed, tool_claimed), or work for another queue (model, tool)."""

    action: str  # "done" | "wait" | "model_claimed" | "tool_claimed" | "model" | "tool"
    step_id: uuid.UUID | None = None
    step: Step | None = None  # claimed work: the row, claimed
    session: AgentSession | None = None
    approval: Any = None  # the approval a claimed tool step consumed

    @property
    def session_id(self) -> uuid.UUID | None:
        return self.session.id if self.session is not None else (self.step.session_id if self.step else None)


def _fail_budget(turn: Turn, budget: tuple[str, int, float]) -> None:
    name, limit, used = budget
    with transaction.atomic():
        event_record(session_id=turn.session_id, turn_id=turn.id, type="budget.exceeded",
                     payload={"budget": name, "limit": limit, "used": used})
        turn_fail(turn_id=turn.id, code="budget_exceeded",
                  message=f"The session's budget {name} ({limit}) is used up ({used:g}).")


def decide(turn_id: uuid.UUID | str, *, claim_model: bool = False, claim_inline_tool: bool = False,
           session_id: uuid.UUID | None = None) -> Next:
    """Advance the turn as far as it can go without slow work; say what comes next.

    One short transaction holding the session lock: the decision and its claim are atomic.
    With ``claim_model`` (the caller is on the llm queue) the next model step is claimed here
    (``model_claimed``), with ``claim_inline_tool`` the next approved tool that needs no
    sandbox (``tool_claimed``): one transaction per action instead of two. ``session_id``, when
    the caller knows it (``Next.session_id`` of the previous tick), spares a look-up.
    """
    if session_id is None:
        session_id = Turn.objects.filter(pk=turn_id).values_list("session_id", flat=True).first()
        if session_id is None:
            return Next("done")
    with transaction.atomic():
        # The session lock serialises every write of the session, the turn's included.
        session = session_lock_fetch(session_id)
        turn = Turn.objects.filter(pk=turn_id).first()
        if session is None or turn is None or not turn.is_active:
            return Next("done")
        if turn.status == Turn.Status.QUEUED:
            turn = turn_move(turn.id, Turn.Status.RUNNING)
        # Only the newest model step and the tool calls it planned matter: a model step is
        # created only once every earlier tool step settled, so older steps are history.
        # (Reading just these keeps a tick flat in the length of the turn.)
        last_model = Step.objects.filter(turn=turn, kind=Step.Kind.MODEL).order_by("-index").first()
        if last_model is not None and last_model.status in (Step.Status.PLANNED, Step.Status.RUNNING):
            # A model step in flight: its task owns the turn.
            if last_model.status == Step.Status.RUNNING:
                return Next("wait")
            if claim_model:
                claimed = _claim_model(last_model)
                return Next("model_claimed", last_model.id, claimed) if claimed else Next("wait")
            return Next("model", last_model.id)
        batch_qs = Step.objects.filter(turn=turn, kind=Step.Kind.TOOL,
                                       index__gt=last_model.index if last_model else -1).order_by("index")
        tool_steps = list(batch_qs.all())
        for step in tool_steps:
            if step.status == Step.Status.PLANNED:
                step.status = tools.gate_step(step=step, session=session)
        statuses = {s.status for s in tool_steps}

        if any(s.status == Step.Status.RUNNING and s.lease_expires_at is not None for s in tool_steps):
            return Next("wait")  # a command is running; its task enqueues the next tick
        approved = [s for s in tool_steps if s.status == Step.Status.APPROVED]
        if approved:
            _sync_turn(turn, Turn.Status.RUNNING)
            budget = budget_exceeded(session_counters(session), turn.started_at, before="tool")
            if budget:
                _fail_budget(turn, budget)
                return Next("done")
            step = approved[0]
            if claim_inline_tool and not tools.needs_sandbox_queue(step):
                approval = tools.claim_tool_step_locked(step)
                return Next("tool_claimed", step.id, step, session, approval)
            return Next("tool", step.id)
        if Step.Status.AWAITING_APPROVAL in statuses or Step.Status.IN_DOUBT in statuses:
            _sync_turn(turn, Turn.Status.AWAITING_APPROVAL)
            return Next("wait")
        if Step.Status.RUNNING in statuses:  # only client tools (no lease) are left running
            _sync_turn(turn, Turn.Status.REQUIRES_ACTION)
            return Next("wait")

        # Every tool step is settled: the model speaks next, or the turn is complete.
        _sync_turn(turn, Turn.Status.RUNNING)
        if last_model is not None and last_model.status == Step.Status.COMPLETED and not tool_steps:
            output = str((last_model.message or {}).get("content") or "")
            turn_move(turn.id, Turn.Status.COMPLETED, output_text=output)
            return Next("done")
        budget = budget_exceeded(session_counters(session), turn.started_at, before="model")
        if budget:
            _fail_budget(turn, budget)
            return Next("done")
        index = max([s.index for s in tool_steps] + [last_model.index if last_model else -1]) + 1
        if claim_model:  # created already claimed: no planned row to claim a moment later
            step = step_create_claimed(session=session, turn=turn, index=index, lease_seconds=llm.model_lease_seconds())
            return Next("model_claimed", step.id, step)
        step = Step.objects.create(session=session, turn=turn, index=index, kind=Step.Kind.MODEL)
        return Next("model", step.id)


def _claim_model(step: Step) -> Step | None:
    return step_claim(step_id=step.id, from_status=Step.Status.PLANNED, lease_seconds=llm.model_lease_seconds(),
                      event_type="model.started", known=step)


def _sync_turn(turn: Turn, to: str) -> None:
    if turn.status != to:
        turn_move(turn.id, to)
        turn.status = to


def advance(turn_id: uuid.UUID | str, *, on_llm_worker: bool = False) -> None:
    """Drive a turn until it must wait or hand off. Called by every engine task."""
    from sessions_app import tasks

    started = time.monotonic()
    session_id: uuid.UUID | None = None
    while True:
        # Past the inline budget nothing more is claimed here: hand over to a fresh task.
        fresh = time.monotonic() - started <= INLINE_SECONDS
        nxt = decide(turn_id, claim_model=on_llm_worker and fresh, claim_inline_tool=fresh, session_id=session_id)
        session_id = nxt.session_id or session_id
        if nxt.action in ("done", "wait"):
            return
        if nxt.action == "model_claimed":
            assert nxt.step is not None
            inline.run(nxt.step, deadline=started + INLINE_SECONDS)
            continue
        if nxt.action == "tool_claimed":
            assert nxt.step is not None and nxt.session is not None
            tools.run_claimed_tool_step(nxt.step, nxt.approval, nxt.session)
            continue
        # Work for another task. A fresh tick on the llm worker has claimed any model call, and
        # every fresh tick has claimed any tool that needs no sandbox: what is left is a model
        # call seen from the engine queue, a sandboxed command, or anything past the inline budget.
        if not fresh:
            tasks.turn_advance_task.delay(str(turn_id))
        elif nxt.action == "model":
            tasks.model_call_task.delay(str(nxt.step_id))
        else:
            tasks.tool_run_task.delay(str(nxt.step_id))
        return

