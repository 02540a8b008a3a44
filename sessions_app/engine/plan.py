"""The engine's decision: a pure function from a snapshot of a turn to the one next action.

No database, no Celery, no clock: ``tick.py`` loads the snapshot under the session lock, asks
``next_action`` and applies the answer. Only the newest model step and the tool calls it planned
matter: a model step is created only once every earlier tool step has settled, so older steps are
history (which also keeps a tick flat in the length of the turn).
"""

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessions_app.engine.budgets import Budget, budget_crossed
from sessions_app.engine.context import OVERFLOW
from sessions_app.models import Step, Turn


class Action(enum.Enum):
    FINISHED = "finished"            # the turn is over (completed, failed, cancelled): nothing to do
    WAIT = "wait"                    # a model call, command, approval or client tool is in flight
    GATE_TOOLS = "gate_tools"        # planned tool calls: gate each (run, grant, ask a reviewer, fail)
    FAIL_BUDGET = "fail_budget"      # the next call would cross a budget: fail the turn
    COMPLETE_TURN = "complete_turn"  # the model answered without tool calls: that is the output
    CLAIM_MODEL = "claim_model"      # call the model here (create the step, or claim the planned one)
    COMPACT = "compact"              # plan a compaction step first (the prompt nears the window, or overflowed)
    FAIL_CONTEXT = "fail_context"    # the prompt overflows the window and nothing is left to compact
    VERIFY = "verify"                # plan a verification of the answer against the acceptance criteria
    ENQUEUE_MODEL = "enqueue_model"  # hand the model call to the model gateway (create the step first)
    CLAIM_TOOL = "claim_tool"        # run an approved in-process tool here
    ENQUEUE_TOOL = "enqueue_tool"    # hand an approved sandboxed tool to the sandbox queue
    HAND_OVER = "hand_over"          # this worker's time is up: a fresh tick goes on


@dataclass(frozen=True)
class StepState:
    """What the decision needs of one step."""

    id: uuid.UUID
    index: int
    status: str
    leased: bool = False        # running under a lease (a worker holds it), not a client tool waiting
    in_process: bool = False    # a tool that runs in the engine's worker, without the sandbox queue
    waits: bool = False         # an engine tool waiting on its own work (subagents): no worker, no client
    content: str = ""           # a model step's text
    kind: str = "model"         # for the last model step: a model call, a compaction or a verification
    error_code: str = ""
    met: bool = False           # a verification: every criterion met


@dataclass(frozen=True)
class Snapshot:
    turn_status: str
    last_model: StepState | None
    tools: Sequence[StepState]            # the tool steps the last model step planned, by index
    counters: Mapping[str, Any]           # the session's counters and budgets (``budgets.session_counters``)
    turn_seconds: float                   # how long the turn has run
    calls_models: bool = False            # this worker calls models (the model gateway)
    fresh: bool = True                    # within this worker's time for inline work (``tick.INLINE_SECONDS``)
    context_tokens: int = 0               # the next prompt's estimate (``context.prompt_estimate``)
    compact_at: int | None = None         # compact from this estimate on; None: no window, never
    compactable: bool = False             # there is history older than the recent steps to replace
    compact_requested: bool = False       # an operator asked to compact now
    has_criteria: bool = False            # the session has acceptance criteria: answers are verified
    unmet_rounds: int = 0                 # this turn's verifications that found criteria unmet
    max_rework: int = 2                   # re-work rounds allowed after an unmet verification


@dataclass(frozen=True)
class Decision:
    action: Action
    turn_status: str | None = None        # the status the turn must have first (the tick moves it)
    step_id: uuid.UUID | None = None      # the step acted on; None with CLAIM/ENQUEUE_MODEL: create it
    new_index: int | None = None          # the index of a model step to create
    budget: Budget | None = None
    output_text: str = ""
    claim: bool = False                   # COMPACT: this worker calls the model (claim it) or enqueues it
    reason: str = ""                      # COMPACT: "threshold", "overflow" or "operator"
    criteria_unmet: bool = False          # COMPLETE_TURN: after its re-work rounds, criteria still unmet


RUNNING, AWAITING, REQUIRES_ACTION = Turn.Status.RUNNING, Turn.Status.AWAITING_APPROVAL, Turn.Status.REQUIRES_ACTION


def next_action(s: Snapshot) -> Decision:
    """The one next action of a turn."""
    if s.turn_status not in Turn.ACTIVE:
        return Decision(Action.FINISHED)
    model = s.last_model
    if model is not None and model.status == Step.Status.RUNNING:
        return Decision(Action.WAIT)  # a model call in flight: its worker owns the turn
    if model is not None and model.status == Step.Status.PLANNED:
        return Decision(_model_action(s), turn_status=RUNNING, step_id=model.id)

    statuses = {t.status for t in s.tools}
    if Step.Status.PLANNED in statuses:
        budget = budget_crossed(s.counters, s.turn_seconds, before="tool")
        if budget:  # no reviewer is asked about a call the budget would not let run
            return Decision(Action.FAIL_BUDGET, turn_status=RUNNING, budget=budget)
        return Decision(Action.GATE_TOOLS)
    if any(t.status == Step.Status.RUNNING and (t.leased or t.waits) for t in s.tools):
        return Decision(Action.WAIT)  # a command runs (its task ticks when it is done), or subagents
    approved = [t for t in s.tools if t.status == Step.Status.APPROVED]
    if approved:
        budget = budget_crossed(s.counters, s.turn_seconds, before="tool")
        if budget:
            return Decision(Action.FAIL_BUDGET, turn_status=RUNNING, budget=budget)
        tool = approved[0]
        action = Action.ENQUEUE_TOOL if not tool.in_process else Action.CLAIM_TOOL if s.fresh else Action.HAND_OVER
        return Decision(action, turn_status=RUNNING, step_id=tool.id)
    if Step.Status.AWAITING_APPROVAL in statuses or Step.Status.IN_DOUBT in statuses:
        return Decision(Action.WAIT, turn_status=AWAITING)
    if Step.Status.RUNNING in statuses:  # only client tools (no lease) are left running
        return Decision(Action.WAIT, turn_status=REQUIRES_ACTION)

    # Every tool step has settled: the model speaks next, or its last answer is the output.
    call = model if model is not None and model.kind == Step.Kind.MODEL else None
    if call is not None and call.status == Step.Status.COMPLETED and not s.tools:
        if s.has_criteria:  # judged before it completes the turn (a verification is a model call)
            return Decision(Action.VERIFY, turn_status=RUNNING, new_index=call.index + 1,
                            claim=_model_action(s) == Action.CLAIM_MODEL, output_text=call.content)
        return Decision(Action.COMPLETE_TURN, turn_status=RUNNING, output_text=call.content)
    verified = model is not None and model.kind == Step.Kind.VERIFICATION and model.status == Step.Status.COMPLETED
    if verified and model is not None and (model.met or s.unmet_rounds > s.max_rework):
        return Decision(Action.COMPLETE_TURN, turn_status=RUNNING, output_text=model.content,
                        criteria_unmet=not model.met)
    # Unmet, rounds left: back to work; the verdicts are in its prompt (``verification_message``).
    overflowed = call is not None and call.status == Step.Status.FAILED and call.error_code == OVERFLOW
    if overflowed and not s.compactable:
        return Decision(Action.FAIL_CONTEXT, turn_status=RUNNING)
    budget = budget_crossed(s.counters, s.turn_seconds, before="model")
    if budget:
        return Decision(Action.FAIL_BUDGET, turn_status=RUNNING, budget=budget)
    index = max([t.index for t in s.tools] + [model.index if model else -1]) + 1
    # Compact before the call that would cross the threshold; never twice in a row (a summary
    # that leaves the prompt big still lets the call go; the provider's overflow is handled above).
    just_compacted = model is not None and model.kind == Step.Kind.COMPACTION
    crossing = s.compact_at is not None and s.context_tokens >= s.compact_at
    if overflowed or ((crossing or s.compact_requested) and s.compactable and not just_compacted):
        reason = "overflow" if overflowed else "threshold" if crossing else "operator"
        return Decision(Action.COMPACT, turn_status=RUNNING, new_index=index,
                        claim=_model_action(s) == Action.CLAIM_MODEL, reason=reason)
    return Decision(_model_action(s), turn_status=RUNNING, new_index=index)


def _model_action(s: Snapshot) -> Action:
    return Action.CLAIM_MODEL if s.calls_models and s.fresh else Action.ENQUEUE_MODEL
