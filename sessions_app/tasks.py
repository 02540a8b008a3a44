"""Celery interfaces of the engine: ids in, idempotent, the work claimed by the services."""

import uuid

from celery import shared_task

from sessions_app.engine import driver, recovery, tools


def _turn_of(step_id: str) -> uuid.UUID | None:
    from sessions_app.models import Step

    return Step.objects.filter(pk=step_id).values_list("turn_id", flat=True).first()


@shared_task(acks_late=True, ignore_result=True)
def turn_advance_task(turn_id: str) -> None:
    driver.advance(turn_id)


@shared_task(acks_late=True, ignore_result=True)
def model_call_task(step_id: str) -> None:
    """On the llm queue: the tick claims the turn's planned model step (a duplicate finds it claimed)."""
    turn_id = _turn_of(step_id)
    if turn_id is not None:
        driver.advance(turn_id, on_llm_worker=True)


@shared_task(acks_late=True, ignore_result=True)
def tool_run_task(step_id: str) -> None:
    """On the sandbox queue: claim and run the approved step, then tick."""
    turn_id = _turn_of(step_id)
    if turn_id is not None:
        tools.run_tool_step(step_id)
        driver.advance(turn_id)


@shared_task(acks_late=True, ignore_result=True)
def recovery_sweep_task() -> None:
    recovery.sweep()
