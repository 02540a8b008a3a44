"""Bulk approval, only where it is safe: identical requests (same tool, same run-spec hash, same
policy) across sessions, approved from one page. Each request is still decided through
``approval_decide`` (its own lock, four-eyes, quorum vote, audit row and event) and consumed
individually by its own run.
"""

import uuid
from typing import Any

from django.contrib.auth.models import User

from agentops.domain import DomainError, InvalidArguments, NotFound
from agentops.teams import scope
from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_decide

MAX_BATCH = 200


def approval_bulk_approve(*, request_ids: list[Any], actor: User, arguments_sha256: str,
                          reason: str = "") -> dict[str, str]:
    """Approve every request of the batch, which must all be pending tool requests of the same
    tool, run-spec hash (``arguments_sha256``, the one the reviewer saw) and policy; otherwise
    nothing is decided (422). Returns each request's outcome: its status, or the refusal's code."""
    if not request_ids or len(request_ids) > MAX_BATCH:
        raise InvalidArguments(f"Send 1 to {MAX_BATCH} request ids.", details={"field": "request_ids"})
    try:
        keys = sorted({uuid.UUID(str(r)) for r in request_ids})
    except ValueError as exc:
        raise InvalidArguments("Request ids are UUIDs.", details={"field": "request_ids"}) from exc
    rows = list(scope(ApprovalRequest.objects.filter(request_id__in=keys), actor))  # other teams' look missing
    if len(rows) != len(keys):
        raise NotFound("Some requests do not exist.", code="unknown_requests",
                               details={"missing": sorted(str(k) for k in set(keys) - {r.request_id for r in rows})})
    shapes = {(r.kind, r.tool_name, r.arguments_sha256, r.policy_id) for r in rows}
    if len(shapes) != 1 or next(iter(shapes))[0] != ApprovalRequest.Kind.TOOL:
        raise InvalidArguments("Only identical tool requests (same tool, arguments hash and policy) are approved "
                               "together.", code="not_identical")
    if rows[0].arguments_sha256 != arguments_sha256:
        raise InvalidArguments("The requests are not the ones you reviewed (arguments hash differs).",
                               code="stale_arguments", details={"current_sha256": rows[0].arguments_sha256})
    outcomes: dict[str, str] = {}
    for key in keys:
        try:
            approval = approval_decide(request_id=key, actor=actor, decision="approve", reason=reason,
                                       seen_hash=arguments_sha256)
            outcomes[str(key)] = approval.status
        except DomainError as exc:  # one refusal (four-eyes, decided meanwhile) leaves the others decided
            outcomes[str(key)] = exc.code
    return outcomes
