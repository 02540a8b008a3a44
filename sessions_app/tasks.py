"""Celery interfaces of the engine: ids in, idempotent, the work claimed by the services."""

from celery import shared_task

from sessions_app.engine import driver, recovery, tools


@shared_task(acks_late=True, ignore_result=True)
def turn_advance_task(turn_id: str) -> None:
    driver.advance(turn_id)


@shared_task(acks_late=True, ignore_result=True)
def model_call_task(step_id: str) -> None:
    from sessions_app.models import Step

    turn_id = Step.objects.filter(pk=step_id).values_list("turn_id", flat=True).first()
    if turn_id is None:
        return
    driver.run_model_step(step_id)
    driver.advance(turn_id, on_llm_worker=True)


@shared_task(acks_late=True, ignore_result=True)
def tool_run_task(step_id: str) -> None:
    from sessions_app.models import Step

    turn_id = Step.objects.filter(pk=step_id).values_list("turn_id", flat=True).first()
    if turn_id is None:
        return
    tools.run_tool_step(step_id)
    driver.advance(turn_id)


@shared_task(acks_late=True, ignore_result=True)
def recovery_sweep_task() -> None:
    recovery.sweep()
