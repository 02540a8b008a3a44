"""Batches: many sessions started at once from one list of inputs, all or none, idempotent."""

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from agentops import dispatch
from agentops.domain import Conflict, DomainError, InvalidArguments
from agentops.teams import OPERATE_ROLES, require_team_role
from fanout_app.models import Batch, BatchMember
from sessions_app.engine.turns import turn_cancel
from sessions_app.models import AgentProfile, Turn
from sessions_app.services import session_create_with_turn, session_quota_check

ROW_FIELDS = {"input", "title", "pinned", "budget", "metadata"}


class BatchTooLarge(DomainError):
    """The batch has more rows than allowed."""

    code = "batch_too_large"
    status = 413


def _check_rows(rows: Sequence[Any]) -> None:
    if not isinstance(rows, list) or not rows:
        raise InvalidArguments("rows must be a non-empty list of {input, title?, pinned?, budget?, metadata?}",
                               details={"field": "rows"})
    limit = settings.AGENTOPS_BATCH_MAX_ROWS
    if len(rows) > limit:
        raise BatchTooLarge(f"{len(rows)} rows; a batch holds at most {limit}.", details={"limit": limit})
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InvalidArguments(f"row {i}: must be an object", details={"row": i})
        unknown = set(row) - ROW_FIELDS
        if unknown:
            raise InvalidArguments(f"row {i}: unknown fields {sorted(unknown)}", details={"row": i})
        text = row.get("input")
        if not isinstance(text, str) or not text.strip():
            raise InvalidArguments(f"row {i}: input must be a non-empty string", details={"row": i, "field": "input"})


def _sha(agent: AgentProfile, rows: Sequence[Any], title: str) -> str:
    return hashlib.sha256(json.dumps([agent.slug, title, rows], sort_keys=True, default=str).encode()).hexdigest()


def batch_create(*, agent: AgentProfile, owner: User, rows: Sequence[Any], title: str = "",
                 idempotency_key: str = "") -> tuple[Batch, bool]:
    """Create the batch and its sessions, each with its first turn; the engine starts after commit.
    A row that does not validate refuses the whole batch with that row's error (nothing is created).
    Returns (batch, created): a replay with the same Idempotency-Key and rows returns the first batch."""
    _check_rows(rows)
    sha = _sha(agent, rows, title)
    if idempotency_key:
        found = Batch.objects.filter(owner=owner, idempotency_key=idempotency_key).first()
        if found is not None:
            return _replayed(found, sha)
    session_quota_check(owner=owner)
    try:
        with transaction.atomic():
            batch = Batch.objects.create(team_id=agent.team_id, agent=agent, owner=owner, title=title[:200],
                                         idempotency_key=idempotency_key, request_sha256=sha, size=len(rows))
            for i, row in enumerate(rows):
                try:
                    session, turn = session_create_with_turn(
                        agent=agent, owner=owner, input=row["input"], title=str(row.get("title") or "")[:200]
                        or f"{title or 'batch'} #{i + 1}", pinned=row.get("pinned"), budget=row.get("budget"),
                        metadata=row.get("metadata"))
                except DomainError as exc:
                    raise InvalidArguments(f"row {i}: {exc.message}", details={"row": i, **exc.details}) from exc
                BatchMember.objects.create(batch=batch, session=session, row=i)
                dispatch.turn_start_enqueue(turn.id, session_id=turn.session_id)
    except IntegrityError:  # a concurrent request with the same key won
        found = Batch.objects.filter(owner=owner, idempotency_key=idempotency_key).first()
        if found is None:
            raise
        return _replayed(found, sha)
    return batch, True


def _replayed(batch: Batch, sha: str) -> tuple[Batch, bool]:
    if batch.request_sha256 != sha:
        raise Conflict("This Idempotency-Key was used for another batch.", code="idempotency_key_reused",
                       details={"batch_id": str(batch.id)})
    return batch, False


def batch_cancel(*, batch: Batch, actor: User) -> int:
    """Cancel the active turn of every session of the batch (its approvals and open steps with it,
    as the session page's Cancel does). One transaction per turn, under its session's lock: a turn
    that ends meanwhile is skipped, and a batch of a thousand never holds a thousand locks at once.
    Sessions that are idle, or that an operator starts again afterwards, are left alone. Returns how
    many turns were cancelled (0 on a second call)."""
    require_team_role(actor, batch.team_id, OPERATE_ROLES, what="cancel its sessions")
    active = Turn.objects.filter(session__batch_member__batch=batch, status__in=Turn.ACTIVE)
    cancelled = 0
    for turn_id in list(active.values_list("id", flat=True)):
        with transaction.atomic():
            if turn_cancel(turn_id=turn_id, actor=actor) is not None:
                cancelled += 1
    return cancelled
