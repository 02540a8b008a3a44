"""``next_action`` as a table: every branch of the engine's decision, no database, no Celery."""

import uuid
from dataclasses import replace
from typing import Any

import pytest

from sessions_app.engine.budgets import Budget
from sessions_app.engine.plan import Action, Decision, Snapshot, StepState, next_action

NO_BUDGETS: dict[str, Any] = {"model_calls": 3, "tool_calls": 2, "prompt_tokens": 100, "completion_tokens": 10,
                              "wall_seconds": 5.0, "max_tool_calls": None, "max_model_calls": None,
                              "max_tokens": None, "max_wall_seconds": None}
M = uuid.UUID(int=1)
T1, T2, T3 = uuid.UUID(int=11), uuid.UUID(int=12), uuid.UUID(int=13)


def model(status: str, *, index: int = 0, content: str = "", kind: str = "model", error_code: str = "",
          met: bool = False) -> StepState:
    return StepState(id=M, index=index, status=status, leased=status == "running", content=content, kind=kind,
                     error_code=error_code, met=met)


def tool(step_id: uuid.UUID, status: str, *, index: int, leased: bool = False, in_process: bool = False) -> StepState:
    return StepState(id=step_id, index=index, status=status, leased=leased, in_process=in_process)


def snap(turn: str = "running", last_model: StepState | None = None, tools: tuple[StepState, ...] = (),
         counters: dict[str, Any] | None = None, turn_seconds: float = 1.0, calls_models: bool = False,
         fresh: bool = True, context_tokens: int = 0, compact_at: int | None = None,
         compactable: bool = False, compact_requested: bool = False, has_criteria: bool = False,
         unmet_rounds: int = 0, max_rework: int = 2) -> Snapshot:
    return Snapshot(turn_status=turn, last_model=last_model, tools=tools, counters=counters or NO_BUDGETS,
                    turn_seconds=turn_seconds, calls_models=calls_models, fresh=fresh, context_tokens=context_tokens,
                    compact_at=compact_at, compactable=compactable,
                    compact_requested=compact_requested, has_criteria=has_criteria, unmet_rounds=unmet_rounds,
                    max_rework=max_rework)


def budgets(**limits: int) -> dict[str, Any]:
    return {**NO_BUDGETS, **limits}


CASES: list[tuple[str, Snapshot, Decision]] = [
    # The turn is over: nothing to do, whatever its steps say.
    ("completed turn", snap("completed", model("completed")), Decision(Action.FINISHED)),
    ("failed turn", snap("failed", model("running")), Decision(Action.FINISHED)),
    ("cancelled turn with a tool awaiting approval",
     snap("cancelled", model("completed"), (tool(T1, "awaiting_approval", index=1),)), Decision(Action.FINISHED)),
    # A new turn: the first model call, created at index 0; where it runs depends on the worker.
    ("queued turn, Celery tick", snap("queued"),
     Decision(Action.ENQUEUE_MODEL, turn_status="running", new_index=0)),
    ("queued turn, gateway", snap("queued", calls_models=True),
     Decision(Action.CLAIM_MODEL, turn_status="running", new_index=0)),
    ("queued turn, gateway past its time", snap("queued", calls_models=True, fresh=False),
     Decision(Action.ENQUEUE_MODEL, turn_status="running", new_index=0)),
    # A model step in flight or planned.
    ("model call running", snap("running", model("running")), Decision(Action.WAIT)),
    ("model planned (retry after a crash), Celery tick", snap("running", model("planned", index=4)),
     Decision(Action.ENQUEUE_MODEL, turn_status="running", step_id=M)),
    ("model planned, gateway", snap("running", model("planned", index=4), calls_models=True),
     Decision(Action.CLAIM_MODEL, turn_status="running", step_id=M)),
    # The model answered.
    ("final answer", snap("running", model("completed", content="done")),
     Decision(Action.COMPLETE_TURN, turn_status="running", output_text="done")),
    ("tool calls planned", snap("running", model("completed"), (tool(T1, "planned", index=1),
                                                                tool(T2, "approved", index=2))),
     Decision(Action.GATE_TOOLS)),
    # Approved tools: in-process ones run here while fresh, sandboxed ones go to their queue.
    ("approved in-process tool", snap("running", model("completed"), (tool(T1, "approved", index=1, in_process=True),)),
     Decision(Action.CLAIM_TOOL, turn_status="running", step_id=T1)),
    ("approved in-process tool past the worker's time",
     snap("running", model("completed"), (tool(T1, "approved", index=1, in_process=True),), fresh=False),
     Decision(Action.HAND_OVER, turn_status="running", step_id=T1)),
    ("approved command", snap("awaiting_approval", model("completed"), (tool(T1, "approved", index=1),)),
     Decision(Action.ENQUEUE_TOOL, turn_status="running", step_id=T1)),
    ("first approved of several, in order",
     snap("running", model("completed"), (tool(T1, "completed", index=1), tool(T2, "approved", index=2),
                                          tool(T3, "approved", index=3, in_process=True))),
     Decision(Action.ENQUEUE_TOOL, turn_status="running", step_id=T2)),
    ("a command runs (leased): wait, even with another approved",
     snap("running", model("completed"), (tool(T1, "running", index=1, leased=True), tool(T2, "approved", index=2))),
     Decision(Action.WAIT)),
    # Waiting for people.
    ("awaiting approval", snap("running", model("completed"), (tool(T1, "awaiting_approval", index=1),
                                                               tool(T2, "completed", index=2))),
     Decision(Action.WAIT, turn_status="awaiting_approval")),
    ("in doubt after a crash: a reviewer decides",
     snap("running", model("completed"), (tool(T1, "in_doubt", index=1),)),
     Decision(Action.WAIT, turn_status="awaiting_approval")),
    ("approved runs before waiting for another approval",
     snap("awaiting_approval", model("completed"), (tool(T1, "awaiting_approval", index=1),
                                                    tool(T2, "approved", index=2))),
     Decision(Action.ENQUEUE_TOOL, turn_status="running", step_id=T2)),
    ("client tool waits for the integration (running, no lease)",
     snap("running", model("completed"), (tool(T1, "running", index=1),)),
     Decision(Action.WAIT, turn_status="requires_action")),
    ("client tool and an approval: approval first",
     snap("running", model("completed"), (tool(T1, "running", index=1), tool(T2, "awaiting_approval", index=2))),
     Decision(Action.WAIT, turn_status="awaiting_approval")),
    # Every tool settled (results, rejections, expiries, failures): the model speaks next.
    ("all settled: next model call after the last tool",
     snap("awaiting_approval", model("completed", index=3),
          (tool(T1, "completed", index=4), tool(T2, "rejected", index=5), tool(T3, "expired", index=6))),
     Decision(Action.ENQUEUE_MODEL, turn_status="running", new_index=7)),
    ("all settled after a client tool, gateway",
     snap("requires_action", model("completed", index=0), (tool(T1, "completed", index=1),), calls_models=True),
     Decision(Action.CLAIM_MODEL, turn_status="running", new_index=2)),
    ("cancelled and failed tools are settled too",
     snap("running", model("completed", index=0), (tool(T1, "cancelled", index=1), tool(T2, "failed", index=2))),
     Decision(Action.ENQUEUE_MODEL, turn_status="running", new_index=3)),
    # Budgets: checked before the call that would cross them.
    ("model calls used up", snap("running", model("completed"), (tool(T1, "completed", index=1),),
                                 counters=budgets(max_model_calls=3)),
     Decision(Action.FAIL_BUDGET, turn_status="running", budget=Budget("max_model_calls", 3, 3))),
    ("tool calls used up", snap("running", model("completed"), (tool(T1, "approved", index=1),),
                                counters=budgets(max_tool_calls=2)),
     Decision(Action.FAIL_BUDGET, turn_status="running", budget=Budget("max_tool_calls", 2, 2))),
    ("tool calls used up before the gate: no reviewer is asked", snap(
        "running", model("completed"), (tool(T1, "planned", index=1),), counters=budgets(max_tool_calls=2)),
     Decision(Action.FAIL_BUDGET, turn_status="running", budget=Budget("max_tool_calls", 2, 2))),
    ("tool budget does not stop a model call", snap("running", model("completed"), (tool(T1, "completed", index=1),),
                                                    counters=budgets(max_tool_calls=2)),
     Decision(Action.ENQUEUE_MODEL, turn_status="running", new_index=2)),
    ("tokens used up before a model call", snap("queued", counters=budgets(max_tokens=110)),
     Decision(Action.FAIL_BUDGET, turn_status="running", budget=Budget("max_tokens", 110, 110))),
    ("tokens used up before a tool call", snap("running", model("completed"), (tool(T1, "approved", index=1),),
                                               counters=budgets(max_tokens=50)),
     Decision(Action.FAIL_BUDGET, turn_status="running", budget=Budget("max_tokens", 50, 110))),
    ("wall time counts finished turns and this one", snap("running", model("completed"),
                                                          (tool(T1, "completed", index=1),),
                                                          counters=budgets(max_wall_seconds=10), turn_seconds=5.0),
     Decision(Action.FAIL_BUDGET, turn_status="running", budget=Budget("max_wall_seconds", 10, 10.0))),
    ("wall time not yet crossed", snap("running", model("completed"), (tool(T1, "completed", index=1),),
                                       counters=budgets(max_wall_seconds=10), turn_seconds=4.9),
     Decision(Action.ENQUEUE_MODEL, turn_status="running", new_index=2)),
    ("a final answer completes even with budgets used up",
     snap("running", model("completed", content="ok"), counters=budgets(max_model_calls=3, max_tokens=1)),
     Decision(Action.COMPLETE_TURN, turn_status="running", output_text="ok")),
    ("a waiting approval is not failed by a budget",
     snap("running", model("completed"), (tool(T1, "awaiting_approval", index=1),), counters=budgets(max_tokens=1)),
     Decision(Action.WAIT, turn_status="awaiting_approval")),
    # Compaction: before the model call whose prompt would cross the threshold.
    ("prompt below the threshold", snap("running", model("completed", index=0), (tool(T1, "completed", index=1),),
                                        context_tokens=799, compact_at=800, compactable=True),
     Decision(Action.ENQUEUE_MODEL, turn_status="running", new_index=2)),
    ("prompt at the threshold: compact first, in the gateway",
     snap("running", model("completed", index=0), (tool(T1, "completed", index=1),), calls_models=True,
          context_tokens=800, compact_at=800, compactable=True),
     Decision(Action.COMPACT, turn_status="running", new_index=2, claim=True, reason="threshold")),
    ("prompt at the threshold, Celery tick: the compaction goes to the gateway",
     snap("running", model("completed", index=0), (tool(T1, "completed", index=1),),
          context_tokens=900, compact_at=800, compactable=True),
     Decision(Action.COMPACT, turn_status="running", new_index=2, claim=False, reason="threshold")),
    ("over the threshold but nothing older than the recent steps: call anyway",
     snap("running", model("completed", index=0), (tool(T1, "completed", index=1),),
          context_tokens=900, compact_at=800, compactable=False),
     Decision(Action.ENQUEUE_MODEL, turn_status="running", new_index=2)),
    ("no window: never compact", snap("running", model("completed", index=0), (tool(T1, "completed", index=1),),
                                      context_tokens=10**9, compact_at=None, compactable=True),
     Decision(Action.ENQUEUE_MODEL, turn_status="running", new_index=2)),
    ("just compacted: the model call follows, never a second compaction",
     snap("running", model("completed", index=2, kind="compaction"), calls_models=True,
          context_tokens=900, compact_at=800, compactable=True),
     Decision(Action.CLAIM_MODEL, turn_status="running", new_index=3)),
    ("compaction running: wait", snap("running", model("running", index=2, kind="compaction")), Decision(Action.WAIT)),
    ("compaction planned (after a crash), gateway", snap("running", model("planned", index=2, kind="compaction"),
                                                         calls_models=True),
     Decision(Action.CLAIM_MODEL, turn_status="running", step_id=M)),
    ("the budget stops a compaction too", snap("running", model("completed"), (tool(T1, "completed", index=1),),
                                              counters=budgets(max_model_calls=3), context_tokens=900,
                                              compact_at=800, compactable=True),
     Decision(Action.FAIL_BUDGET, turn_status="running", budget=Budget("max_model_calls", 3, 3))),
    ("the provider said the prompt is too long: compact, then retry",
     snap("running", model("failed", index=3, error_code="context_length_exceeded"), calls_models=True,
          context_tokens=100, compact_at=800, compactable=True),
     Decision(Action.COMPACT, turn_status="running", new_index=4, claim=True, reason="overflow")),
    ("an operator asked to compact: before the next call, window or not",
     snap("running", model("completed", index=0), (tool(T1, "completed", index=1),), calls_models=True,
          context_tokens=10, compact_at=None, compactable=True, compact_requested=True),
     Decision(Action.COMPACT, turn_status="running", new_index=2, claim=True, reason="operator")),
    ("an operator's request with nothing to compact: the call goes on",
     snap("running", model("completed", index=0), (tool(T1, "completed", index=1),),
          compactable=False, compact_requested=True),
     Decision(Action.ENQUEUE_MODEL, turn_status="running", new_index=2)),
    # Verification: an answer is judged against the acceptance criteria before the turn completes.
    ("final answer with acceptance criteria: verify it first",
     snap("running", model("completed", index=4, content="done"), calls_models=True, has_criteria=True),
     Decision(Action.VERIFY, turn_status="running", new_index=5, claim=True, output_text="done")),
    ("verification running: wait", snap("running", model("running", index=5, kind="verification"),
                                        has_criteria=True), Decision(Action.WAIT)),
    ("criteria met: the verified answer completes the turn",
     snap("running", model("completed", index=5, kind="verification", content="done", met=True),
          has_criteria=True, unmet_rounds=0),
     Decision(Action.COMPLETE_TURN, turn_status="running", output_text="done")),
    ("criteria unmet, rounds left: back to work",
     snap("running", model("completed", index=5, kind="verification", content="done"), calls_models=True,
          has_criteria=True, unmet_rounds=2, max_rework=2),
     Decision(Action.CLAIM_MODEL, turn_status="running", new_index=6)),
    ("criteria unmet after the last round: complete, flagged",
     snap("running", model("completed", index=9, kind="verification", content="done"),
          has_criteria=True, unmet_rounds=3, max_rework=2),
     Decision(Action.COMPLETE_TURN, turn_status="running", output_text="done", criteria_unmet=True)),
    ("too long and nothing left to compact: fail with a clear code",
     snap("running", model("failed", index=3, error_code="context_length_exceeded"),
          context_tokens=100, compact_at=800, compactable=False),
     Decision(Action.FAIL_CONTEXT, turn_status="running")),
]


@pytest.mark.parametrize(("snapshot", "expected"), [(s, d) for _, s, d in CASES], ids=[name for name, _, _ in CASES])
def test_next_action(snapshot: Snapshot, expected: Decision) -> None:
    assert next_action(snapshot) == expected


def test_next_action_covers_every_action() -> None:
    decided = {d.action for _, _, d in CASES}
    assert decided == set(Action)


def test_next_action_is_pure() -> None:
    """The same snapshot gives the same decision, and the snapshot is not changed."""
    snapshot = snap("running", model("completed"), (tool(T1, "approved", index=1),))
    copy = replace(snapshot)
    assert next_action(snapshot) == next_action(snapshot)
    assert snapshot == copy
