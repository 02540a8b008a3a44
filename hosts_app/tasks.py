"""Celery interfaces of the sandbox hosts. The host tasks are sent to one host's queue
(``sandbox.<name>``, ``agentops.dispatch.host_task_enqueue``); the sweep runs on ``engine``."""

from celery import shared_task

from hosts_app import on_host
from hosts_app.services import hosts_mark_offline


@shared_task(acks_late=True, ignore_result=True)
def step_preview_task(step_id: str) -> None:
    on_host.step_preview_compute(step_id)


@shared_task(acks_late=True, ignore_result=True)
def step_manifest_check_task(step_id: str) -> None:
    on_host.step_manifest_check(step_id)


@shared_task(acks_late=True, ignore_result=True)
def workspace_seed_task(session_id: str) -> None:
    on_host.workspace_seed(session_id)


@shared_task(acks_late=True, ignore_result=True)
def host_sweep_task() -> None:
    """Celery beat: hosts with no heartbeat go offline."""
    hosts_mark_offline()
