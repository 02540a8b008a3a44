"""Read queries and view models for the dashboard pages and their live fragments.

An interface-side module (used by views, consumers and the fragment renderer only), so it may
read approvals_app too. Every function runs a fixed number of queries whatever the number of
sessions, turns, steps or events: pages paginate, relations are fetched in bulk.
"""

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.paginator import Page, Paginator
from django.db.models import Count, QuerySet
from django.utils import timezone

from approvals_app import selectors as approval_selectors
from approvals_app.models import ApprovalRequest
from sessions_app import selectors
from sessions_app.models import AgentProfile, AgentSession, Artifact, Event, Step, Turn
from tools_app.models import ToolDefinition

STUCK_AFTER = timedelta(minutes=10)
TURNS_PER_PAGE = 5
SESSIONS_PER_PAGE = 25
QUEUE_LIMIT = 100
ARTIFACTS_LIMIT = 100
OUTPUT_PREVIEW_LINES = 3


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


# --- view models ---------------------------------------------------------------------------

@dataclass
class StepView:
    """One step card: the row, its latest approval request and, while streaming, the text so far."""

    step: Step
    approval: ApprovalRequest | None = None
    stream_text: str = ""
    stream_seq: int = 0
    seq: int = 0  # the newest event this card reflects; the client refuses to go back in time

    @property
    def dom_id(self) -> str:
        return f"step-{self.step.id}"

    @property
    def arguments_json(self) -> str:
        return pretty_json(self.step.arguments)

    @property
    def result(self) -> dict[str, Any]:
        return self.step.result if isinstance(self.step.result, dict) else {}

    @property
    def output(self) -> str:
        return str(self.result.get("output") or "")

    @property
    def output_lines(self) -> int:
        return self.output.count("\n") + 1 if self.output else 0

    @property
    def output_head(self) -> str:
        return "\n".join(self.output.splitlines()[:OUTPUT_PREVIEW_LINES])

    @property
    def exit_code(self) -> Any:
        return self.result.get("exit_code")

    @property
    def duration_ms(self) -> float | None:
        if self.result.get("duration_ms") is not None:
            return float(self.result["duration_ms"])
        if self.step.started_at and self.step.finished_at:
            return (self.step.finished_at - self.step.started_at).total_seconds() * 1000
        return None

    @property
    def files_changed(self) -> list[tuple[str, list[str]]]:
        changed = self.result.get("files_changed") or {}
        if not isinstance(changed, dict):
            return []
        return [(kind, list(changed[kind])) for kind in ("created", "modified", "deleted") if changed.get(kind)]

    @property
    def error_code(self) -> str:
        return self.step.error_code or str(self.result.get("error_code") or "")

    @property
    def error_message(self) -> str:
        return self.step.error_message or str(self.result.get("error_message") or "")

    @property
    def text(self) -> str:
        content = (self.step.message or {}).get("content")
        return content if content else self.stream_text

    @property
    def tool_call_names(self) -> list[str]:
        calls = (self.step.message or {}).get("tool_calls") or []
        return [str(c.get("function", {}).get("name", "?")) for c in calls if isinstance(c, dict)]

    @property
    def is_final(self) -> bool:
        """A completed model call without tool calls: the turn's answer."""
        return (self.step.kind == Step.Kind.MODEL and self.step.status == Step.Status.COMPLETED
                and not self.tool_call_names)


@dataclass
class TurnView:
    turn: Turn
    steps: list[StepView] = field(default_factory=list)
    seq: int = 0

    @property
    def dom_id(self) -> str:
        return f"turn-{self.turn.id}"

    @property
    def has_final(self) -> bool:
        return any(s.is_final for s in self.steps)


@dataclass
class Bar:
    label: str
    used: float
    limit: float | None

    @property
    def percent(self) -> int:
        if not self.limit:
            return 0
        return min(100, round(100 * self.used / self.limit))

    @property
    def level(self) -> str:
        return "high" if self.percent >= 90 else "mid" if self.percent >= 70 else "low"


def usage_bars(session: AgentSession) -> list[Bar]:
    return [
        Bar("Tool calls", session.tool_calls, session.max_tool_calls),
        Bar("Model calls", session.model_calls, session.max_model_calls),
        Bar("Tokens", session.total_tokens, session.max_tokens),
        Bar("Wall seconds", round(session.wall_seconds), session.max_wall_seconds),
    ]


# --- overview ------------------------------------------------------------------------------

@dataclass
class Overview:
    counts: dict[str, int]
    pending_approvals: int
    oldest_pending: ApprovalRequest | None
    stuck: list[AgentSession]
    recent: list[AgentSession]
    stuck_minutes: int


def overview(*, now: datetime | None = None, stuck_after: timedelta = STUCK_AFTER) -> Overview:
    """Five queries."""
    now = now or timezone.now()
    counts = dict.fromkeys(AgentSession.Status.values, 0)
    for row in AgentSession.objects.order_by().values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    oldest = pending.select_related("session").order_by("created_at").first()
    busy = [AgentSession.Status.IN_PROGRESS]
    stuck = list(AgentSession.objects.filter(status__in=busy, last_event_at__lt=now - stuck_after)
                 .select_related("agent").order_by("last_event_at")[:10])
    recent = list(AgentSession.objects.select_related("agent", "owner").order_by("-last_event_at", "-created_at")[:8])
    return Overview(counts=counts, pending_approvals=pending.count(), oldest_pending=oldest, stuck=stuck,
                    recent=recent, stuck_minutes=int(stuck_after.total_seconds() // 60))


# --- session list --------------------------------------------------------------------------

def sessions_page(*, status: str = "", agent: str = "", owner: str = "", q: str = "",
                  page: int | str = 1, per_page: int = SESSIONS_PER_PAGE) -> Page[AgentSession]:
    """Two queries (count, page)."""
    qs = selectors.sessions_list(status=status, agent=agent, owner=owner, q=q)
    return Paginator(qs, per_page).get_page(page)


def agents_for_filter() -> list[AgentProfile]:
    return list(AgentProfile.objects.order_by("name"))


def owners_for_filter() -> list[User]:
    owners = AgentSession.objects.order_by().values("owner_id")
    return list(User.objects.filter(pk__in=owners).order_by("username"))


# --- session detail ------------------------------------------------------------------------

def step_views(steps: Sequence[Step], *, fold_deltas_of: QuerySet[Event] | None = None,
               seq: int = 0) -> list[StepView]:
    """Wrap steps with their latest approval (one query) and the streamed text of running
    model calls (one query, when ``fold_deltas_of`` is given)."""
    if not steps:
        return []
    ids = [s.id for s in steps]
    latest: dict[Any, ApprovalRequest] = {}
    for approval in (ApprovalRequest.objects.filter(step_id__in=ids).select_related("decided_by")
                     .order_by("created_at", "id")):
        latest[approval.step_id] = approval
    texts: dict[Any, list[str]] = {}
    last_seq: dict[Any, int] = {}
    if fold_deltas_of is not None:
        rows = (fold_deltas_of.filter(step_id__in=ids, type="model.delta", step__status=Step.Status.RUNNING)
                .order_by("seq").values_list("step_id", "seq", "payload"))
        for step_id, event_seq, payload in rows:
            texts.setdefault(step_id, []).append(str((payload or {}).get("text", "")))
            last_seq[step_id] = event_seq
    return [StepView(step=s, approval=latest.get(s.id), stream_text="".join(texts.get(s.id, [])),
                     stream_seq=last_seq.get(s.id, 0), seq=seq) for s in steps]


def session_for_page(session_id: Any) -> AgentSession | None:
    return AgentSession.objects.select_related("agent", "owner").filter(pk=session_id).first()


def session_timeline(session: AgentSession, *, before: int | None = None,
                     per_page: int = TURNS_PER_PAGE) -> tuple[list[TurnView], int | None]:
    """The last ``per_page`` turns (before turn index ``before``), oldest first, with their steps.

    Four queries whatever the number of steps or events. Returns (turns, index to page back from
    or None when these are the first turns).
    """
    qs = Turn.objects.filter(session=session).select_related("created_by")
    if before is not None:
        qs = qs.filter(index__lt=before)
    turns = list(qs.order_by("-index")[:per_page + 1])
    more = len(turns) > per_page
    turns = sorted(turns[:per_page], key=lambda t: t.index)
    if not turns:
        return [], None
    steps = list(Step.objects.filter(turn_id__in=[t.id for t in turns]).order_by("index"))
    views = step_views(steps, fold_deltas_of=Event.objects.filter(session=session), seq=session.last_seq)
    by_turn: dict[Any, list[StepView]] = {}
    for view in views:
        by_turn.setdefault(view.step.turn_id, []).append(view)
    result = [TurnView(turn=t, steps=by_turn.get(t.id, []), seq=session.last_seq) for t in turns]
    return result, (turns[0].index if more else None)


def session_artifacts(session: AgentSession) -> list[Artifact]:
    return list(Artifact.objects.filter(session=session).order_by("-created_at")[:ARTIFACTS_LIMIT])


def turn_view(turn: Turn, *, seq: int = 0) -> TurnView:
    steps = list(Step.objects.filter(turn=turn).order_by("index"))
    return TurnView(turn=turn, steps=step_views(steps, fold_deltas_of=Event.objects.filter(session_id=turn.session_id),
                                                seq=seq), seq=seq)


# --- approvals -----------------------------------------------------------------------------

def approval_queue(*, order: str = "oldest", tool: str = "", agent: str = "", risk: str = "",
                   limit: int = QUEUE_LIMIT) -> list[ApprovalRequest]:
    """One query: the pending requests with their session, agent and turn."""
    qs = approval_selectors.approvals_list(status=ApprovalRequest.Status.PENDING, tool=tool, agent=agent, risk=risk,
                                           oldest_first=order != "newest")
    return list(qs.select_related("session__owner", "turn")[:limit])


def queue_tools() -> list[str]:
    return list(ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING).order_by("tool_name")
                .values_list("tool_name", flat=True).distinct())


def approvals_by_request_id(request_ids: Iterable[Any]) -> dict[str, ApprovalRequest]:
    ids = [str(r) for r in request_ids]
    if not ids:
        return {}
    rows = ApprovalRequest.objects.filter(request_id__in=ids).select_related("session__agent", "session__owner", "turn")
    return {str(a.request_id): a for a in rows}


def approval_for_page(request_id: Any) -> ApprovalRequest | None:
    return (ApprovalRequest.objects.select_related("session__agent", "session__owner", "turn__created_by", "step",
                                                   "decided_by")
            .filter(request_id=request_id).first())


def tool_definition(name: str) -> ToolDefinition | None:
    return ToolDefinition.objects.filter(name=name).first()


def diff_lines(preview: str) -> list[tuple[str, str]]:
    """(css class, line) for a unified diff preview."""
    lines = []
    for line in preview.splitlines():
        if line.startswith(("+++", "---")):
            cls = "meta"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        lines.append((cls, line))
    return lines
