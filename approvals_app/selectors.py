"""Reads for approval requests and grants: the API, the reviewers' queue and the pages that show
an approval next to its step."""

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import (
    Case,
    Count,
    IntegerField,
    Min,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.utils import timezone

from agentops.domain import NotFound
from agentops.teams import scope
from approvals_app.models import ApprovalAudit, ApprovalGrant, ApprovalRequest, ApprovalVote, VoteDecision


def approval_get(request_id: Any, *, user: Any) -> ApprovalRequest:
    """A request of the user's teams; NotFound otherwise."""
    try:
        qs = scope(ApprovalRequest.objects.select_related("decided_by", "edited_by", "session", "claimed_by"), user)
        return qs.get(request_id=uuid.UUID(str(request_id)))
    except (ValueError, ApprovalRequest.DoesNotExist) as exc:
        raise NotFound(f"No approval request {request_id}") from exc


def approval_get_for_page(request_id: Any, *, user: Any) -> ApprovalRequest:
    """An approval of the user's teams with everything its decision page shows (two queries: the
    request, its votes);
    NotFound otherwise."""
    try:
        return (scope(ApprovalRequest.objects.all(), user)
                .select_related("session__agent", "session__owner", "turn__created_by", "step", "decided_by",
                                "edited_by", "claimed_by", "reviewer_group")
                .prefetch_related(Prefetch("votes", queryset=ApprovalVote.objects.select_related("reviewer")))
                .get(request_id=uuid.UUID(str(request_id))))
    except (ValueError, ApprovalRequest.DoesNotExist) as exc:
        raise NotFound(f"No approval request {request_id}") from exc


def approvals_list(*, user: Any, status: str | None = None, session: str | None = None, tool: str | None = None,
                   agent: str | None = None, risk: str | None = None,
                   oldest_first: bool = False) -> "QuerySet[ApprovalRequest]":
    qs = scope(ApprovalRequest.objects.select_related("decided_by", "edited_by", "session", "session__agent",
                                                      "claimed_by"), user)
    if status:
        qs = qs.filter(status=status)
    if session:
        try:
            qs = qs.filter(session_id=uuid.UUID(session))
        except ValueError:
            return qs.none()
    if tool:
        qs = qs.filter(tool_name=tool)
    if agent:
        qs = qs.filter(session__agent__slug=agent)
    if risk:
        qs = qs.filter(risk=risk)
    return qs.order_by(*(["created_at", "id"] if oldest_first else ["-created_at", "-id"]))


RISK_ORDER = Case(When(risk="high", then=Value(2)), When(risk="medium", then=Value(1)), default=Value(0),
                  output_field=IntegerField())
CLAIM_FILTERS = ("all", "mine", "unassigned")
# The approvals a request has so far (a subquery: the queue stays one query).
APPROVALS_GIVEN = Subquery(ApprovalVote.objects.filter(request=OuterRef("pk"), decision=VoteDecision.APPROVE)
                           .order_by().values("request").annotate(n=Count("id")).values("n")[:1],
                           output_field=IntegerField())


def approval_queue(*, user: Any, order: str = "oldest", tool: str = "", agent: str = "", risk: str = "",
                   limit: int = 100, after: tuple[datetime, int] | None = None,
                   claim: str = "all") -> list[ApprovalRequest]:
    """The pending requests of the user's teams with their session, agent, owner, turn and claim,
    at most ``limit``; the next page starts ``after`` the (created_at, id) of the previous page's
    last request. Two queries (the page's ids, then its rows; one when the page is empty).
    ``claim``: ``mine`` (live claims of the user), ``unassigned`` (no live claim) or ``all``.
    ``order=risk``: priority, then risk, then age (the first page only).

    A keyset, not an offset: the queue changes while a reviewer scrolls (decisions remove
    requests), and page N by offset would skip or repeat some.
    """
    oldest_first = order != "newest"
    qs = approvals_list(user=user, status=ApprovalRequest.Status.PENDING, tool=tool, agent=agent, risk=risk,
                        oldest_first=oldest_first).select_related("claimed_by")
    now = timezone.now()
    if claim == "mine":
        qs = qs.filter(claimed_by_id=user.pk, claimed_until__gt=now)
    elif claim == "unassigned":
        qs = qs.filter(Q(claimed_by__isnull=True) | Q(claimed_until__lte=now))
    if order == "risk":
        qs = qs.order_by("-priority", RISK_ORDER.desc(), "created_at", "id")
    elif after is not None:
        created, pk = after
        qs = (qs.filter(Q(created_at__gt=created) | Q(created_at=created, id__gt=pk)) if oldest_first
              else qs.filter(Q(created_at__lt=created) | Q(created_at=created, id__lt=pk)))
    # The page is chosen on the requests alone, then its rows are read with what they show. In one
    # query (a join, or the page as a subquery) PostgreSQL joined the session, agent, owner, turn
    # and users of every pending request before picking the 100 shown: 70 ms at 5,000 pending
    # (proof/scale.py, past its 100 ms p95 with the page's rendering).
    page = list(qs.values_list("pk", flat=True)[:limit])
    if not page:
        return []
    rows = (ApprovalRequest.objects.filter(pk__in=page)
            .select_related("decided_by", "edited_by", "session", "session__agent", "session__owner", "turn",
                            "claimed_by")
            .annotate(approvals_given=APPROVALS_GIVEN).order_by(*qs.query.order_by))
    return list(rows)


def identical_pending_groups(*, user: Any, min_size: int = 2) -> list[dict[str, Any]]:
    """Pending tool requests of the user's teams that are identical (same tool, same run-spec hash,
    same policy), in groups of at least ``min_size``, largest first. One query."""
    rows = (scope(ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING,
                                                 kind=ApprovalRequest.Kind.TOOL), user)
            .values("tool_name", "arguments_sha256", "policy_id")
            .annotate(n=Count("id"), first=Min("created_at")).filter(n__gte=min_size).order_by("-n", "first"))
    return list(rows)


def pending_identical(*, user: Any, tool: str, arguments_sha256: str, policy_id: int | None) -> list[ApprovalRequest]:
    """The pending requests of one identical group, oldest first, with their session. One query."""
    qs = scope(ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING, kind=ApprovalRequest.Kind.TOOL,
                                              tool_name=tool, arguments_sha256=arguments_sha256), user)
    qs = qs.filter(policy__isnull=True) if policy_id is None else qs.filter(policy_id=policy_id)
    return list(qs.select_related("session__agent", "session__owner").order_by("created_at", "id")[:500])


def outcomes_described(outcomes: dict[str, str], *, user: Any) -> list[dict[str, Any]]:
    """A bulk approval's outcomes (request id → outcome) with each request's session, tool and
    link, in the order given; a request the user cannot see (any more) is left out. One query."""
    ids = [i for i in outcomes if _uuid_or_none(i) is not None]
    found = {str(a.request_id): a for a in scope(ApprovalRequest.objects.filter(request_id__in=ids), user)
             .select_related("session")} if ids else {}
    return [{"approval": found[i], "outcome": outcomes[i]} for i in ids if i in found]


def queue_tools(*, user: Any) -> list[str]:
    """The tools that have pending requests (the queue filter's choices)."""
    return list(scope(ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING), user)
                .order_by("tool_name")
                .values_list("tool_name", flat=True).distinct())


def pending_summary(*, user: Any) -> tuple[int, ApprovalRequest | None]:
    """How many requests of the user's teams wait for a reviewer, and the oldest. Two queries."""
    pending = scope(ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING), user)
    return pending.count(), pending.select_related("session").order_by("created_at").first()


def approvals_by_request_id(request_ids: Iterable[Any]) -> dict[str, ApprovalRequest]:
    """Approvals as a queue item shows them, by request id as text. One query (none for no ids)."""
    ids = []
    for value in request_ids:
        try:
            ids.append(uuid.UUID(str(value)))
        except ValueError:
            continue
    if not ids:
        return {}
    rows = (ApprovalRequest.objects.filter(request_id__in=ids)
            .select_related("session__agent", "session__owner", "turn", "claimed_by", "reviewer_group")
            .annotate(approvals_given=APPROVALS_GIVEN).prefetch_related("votes__reviewer"))
    return {str(a.request_id): a for a in rows}


def latest_approval_by_step(step_ids: Iterable[Any]) -> dict[Any, ApprovalRequest]:
    """Each step's latest approval request (with who decided), by step id. One query (none for no ids)."""
    ids = list(step_ids)
    if not ids:
        return {}
    latest: dict[Any, ApprovalRequest] = {}
    # Sorted here, not by the query: a step has a handful of requests, and an ORDER BY costs the
    # ORM more (building it) than the sort costs Python (live fragments read this per event batch).
    for approval in ApprovalRequest.objects.filter(step_id__in=ids).select_related("decided_by").order_by():
        known = latest.get(approval.step_id)
        if known is None or (known.created_at, known.id) < (approval.created_at, approval.id):
            latest[approval.step_id] = approval
    return latest


def approval_approved_for_step(step_id: uuid.UUID) -> ApprovalRequest | None:
    """The approved, not yet consumed, tool request of a step (the one its claim consumes)."""
    return (ApprovalRequest.objects.filter(step_id=step_id, kind=ApprovalRequest.Kind.TOOL,
                                           status=ApprovalRequest.Status.APPROVED).order_by("-created_at").first())


def grants_of_session(session_id: Any, *, user: Any) -> list[ApprovalGrant]:
    """A session's grants (of the user's teams), newest first, with who granted and revoked them
    and the turn they end with. One query."""
    key = _uuid_or_none(session_id)
    if key is None:
        return []
    return list(scope(ApprovalGrant.objects.filter(session_id=key), user, field="session__team_id")
                .select_related("granted_by", "revoked_by", "turn", "source_request").order_by("-created_at"))


def grant_get(grant_id: Any, *, user: Any) -> ApprovalGrant:
    """A grant of a session of the user's teams; NotFound otherwise."""
    try:
        return scope(ApprovalGrant.objects.select_related("session"), user, field="session__team_id").get(
            pk=int(str(grant_id)))
    except (ValueError, OverflowError, ApprovalGrant.DoesNotExist) as exc:
        raise NotFound(f"No grant {grant_id}") from exc


def grant_is_live_now(grant: ApprovalGrant, *, current_turn_id: Any = None) -> bool:
    """Neither revoked nor expired (nor ended with its turn, when the current turn is another)."""
    if grant.revoked_at is not None or (grant.expires_at is not None and grant.expires_at <= timezone.now()):
        return False
    if grant.turn_id is not None and grant.turn is not None and not grant.turn.is_active:
        return False  # it ended with its turn
    return grant.turn_id is None or current_turn_id is None or grant.turn_id == current_turn_id


def _uuid_or_none(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def audit_of(request_id: Any) -> list[ApprovalAudit]:
    """A request's audit trail, oldest first. One query."""
    return list(ApprovalAudit.objects.filter(request_id=request_id).order_by("created_at", "id"))
def approvals_pending_of_session(session_id: Any) -> list[ApprovalRequest]:
    """The session's requests waiting for a reviewer, oldest first."""
    return approvals_pending_of_sessions([session_id])


def approvals_pending_of_sessions(session_ids: Iterable[Any]) -> list[ApprovalRequest]:
    """Requests of these sessions waiting for a reviewer, oldest first; one query (none for no ids)."""
    keys = list(session_ids)
    if not keys:
        return []
    return list(ApprovalRequest.objects.filter(session_id__in=keys, status=ApprovalRequest.Status.PENDING)
                .order_by("created_at", "id"))
