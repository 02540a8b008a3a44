"""Celery interface of the reviewer's workflow: the periodic review sweep."""

from celery import shared_task

from approvals_app.assignment import approval_claims_lapse, approval_escalate_due


@shared_task(acks_late=True, ignore_result=True)
def review_sweep_task() -> dict[str, int]:
    """Lapsed claims and due escalations (beat: AGENTOPS_REVIEW_SWEEP_SECONDS)."""
    return {"claims_lapsed": approval_claims_lapse(), "escalated": approval_escalate_due()}
