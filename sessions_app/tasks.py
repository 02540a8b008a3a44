"""Celery interfaces of the engine: ids in, idempotent, the work claimed by the engine.

The engine never imports this module: it enqueues by task name through ``agentops.dispatch``.
"""

from celery import shared_task

from agentops import dispatch
from sessions_app import retention
from sessions_app.engine import recovery, tick, tool_steps
from sessions_app.selectors import turn_id_of_step


@shared_task(acks_late=True, ignore_result=True)
def turn_advance_task(turn_id: str) -> None:
    tick.turn_advance(turn_id)


@shared_task(acks_late=True, ignore_result=True)
def tool_run_task(step_id: str) -> None:
    """On the sandbox queue: claim and run the approved step, then tick."""
    turn_id = turn_id_of_step(step_id)
    if turn_id is not None:
        tool_steps.tool_step_run(step_id)
        tick.turn_advance(turn_id)


@shared_task(acks_late=True, ignore_result=True)
def turn_kick_task(turn_id: str) -> None:
    """The sweeper's wake-up of a quiet turn: the turn may be kicked again once this one ran."""
    dispatch.turn_kick_taken(turn_id)
    tick.turn_advance(turn_id)


@shared_task(acks_late=True, ignore_result=True)
def recovery_sweep_task() -> None:
    recovery.sweep()


@shared_task(acks_late=True, ignore_result=True)
def retention_sweep_task() -> None:
    """Celery beat, every AGENTOPS_RETENTION_SWEEP_SECONDS: stale workspaces, old idempotency records."""
    retention.retention_sweep()
