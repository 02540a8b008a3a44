"""View models of the dashboard: what the templates render, built from rows the selectors read.

No queries here. The pages (``views.py``), the pushed fragments (``fragments.py``) and the
approvals pages build the same view models, so a live update renders exactly what a reload would.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from approvals_app.models import ApprovalRequest
from sessions_app.models import AgentSession, Step, Turn

OUTPUT_PREVIEW_LINES = 3
# While one of these, a session has a turn in flight: the sidebar offers cancel, not send.
ACTIVE_STATUSES = (AgentSession.Status.IN_PROGRESS, AgentSession.Status.AWAITING_APPROVAL,
                   AgentSession.Status.REQUIRES_ACTION)


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


@dataclass
class StepView:
    """One step card: the row, its latest approval request and, while streaming, the text so far."""

    step: Step
    approval: ApprovalRequest | None = None
    stream_text: str = ""
    stream_seq: int = 0
    progress: dict[str, Any] | None = None  # a running command's last structured progress
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
    def compaction(self) -> dict[str, Any]:
        """A compaction card: tokens before → after, why, and its summary as (key, items) rows."""
        if self.step.kind != Step.Kind.COMPACTION:
            return {}
        arguments, result = self.step.arguments or {}, self.result
        summary = result.get("summary") if isinstance(result.get("summary"), dict) else {}
        rows = [(key, [str(x) for x in value] if isinstance(value, list) else [str(value)])
                for key, value in (summary or {}).items() if value not in (None, "", [], {})]
        return {"tokens_before": result.get("tokens_before", arguments.get("tokens_before")),
                "tokens_after": result.get("tokens_after"), "reason": arguments.get("reason", ""),
                "items": arguments.get("items", 0), "summary": rows}

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
    notes: list[dict[str, Any]] = field(default_factory=list)  # pinned edits, compaction requests

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
    field: str = ""  # the session's budget field (the budget form's input)

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
        Bar("Tool calls", session.tool_calls, session.max_tool_calls, "max_tool_calls"),
        Bar("Model calls", session.model_calls, session.max_model_calls, "max_model_calls"),
        Bar("Tokens", session.total_tokens, session.max_tokens, "max_tokens"),
        Bar("Wall seconds", round(session.wall_seconds), session.max_wall_seconds, "max_wall_seconds"),
    ]


def sidebar_context(session: AgentSession, *, can_operate: bool, live: bool = False) -> dict[str, Any]:
    """What ``_sidebar.html`` renders: the page's copy for one user, or (``live``) the copy pushed to
    every viewer, whose controls CSS shows only to operators and which carries no CSRF token."""
    return {"session": session, "bars": usage_bars(session), "active": session.status in ACTIVE_STATUSES,
            "can_operate": can_operate or live, "live": live}


@dataclass
class StuckRow:
    """A session that waits and has been quiet: how long, and on what."""

    session: AgentSession
    age: timedelta
    reason: str

    @property
    def age_text(self) -> str:
        minutes = int(self.age.total_seconds() // 60)
        return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def stuck_reason(session: AgentSession, step: Step | None) -> str:
    """Why a waiting session does not move, in the operator's words."""
    tool = f" {step.tool_name}" if step is not None and step.tool_name else ""
    if step is not None and step.status == Step.Status.IN_DOUBT:
        return f"in doubt after a crash:{tool} waits for a reviewer's recovery decision"
    if session.status == AgentSession.Status.AWAITING_APPROVAL:
        return f"waiting for a reviewer to decide{tool}"
    if session.status == AgentSession.Status.REQUIRES_ACTION:
        return f"waiting for the client's output of{tool} (fails after the tool's timeout)"
    if step is not None and step.status == Step.Status.RUNNING:
        what = "model call" if step.kind == Step.Kind.MODEL else f"command{tool}"
        return f"{what} running"
    if step is not None:
        return f"{step.kind}{tool} {step.status}, not picked up yet (the sweeper re-drives it)"
    return "no step in flight (the sweeper re-drives it)"


def stuck_rows(sessions: Sequence[AgentSession], steps: Mapping[Any, Step], *, now: datetime) -> list[StuckRow]:
    return [StuckRow(session=s, age=now - (s.last_event_at or s.created_at), reason=stuck_reason(s, steps.get(s.id)))
            for s in sessions]


@dataclass
class Overview:
    counts: dict[str, int]
    pending_approvals: int
    oldest_pending: ApprovalRequest | None
    stuck: list[StuckRow]
    recent: list[AgentSession]
    stuck_minutes: int


def step_views(steps: Sequence[Step], *, approvals: Mapping[Any, ApprovalRequest],
               streams: Mapping[Any, tuple[Any, ...]] | None = None, seq: int = 0) -> list[StepView]:
    """Step cards from the steps, each step's latest approval and, for running steps, what they
    streamed so far (``selectors.streamed_texts``: text, seq and a command's progress)."""
    streams = streams or {}
    views = []
    for s in steps:
        text, stream_seq, progress = (tuple(streams[s.id]) + (None,))[:3] if s.id in streams else ("", 0, None)
        views.append(StepView(step=s, approval=approvals.get(s.id), stream_text=text, stream_seq=stream_seq,
                              progress=progress, seq=seq))
    return views


def turn_views(turns: Sequence[Turn], steps: Sequence[StepView], *, seq: int = 0,
               notes: Sequence[dict[str, Any]] = ()) -> list[TurnView]:
    """Turn blocks, each with its step cards in order and its notes (``selectors.notes_of_turns``)."""
    by_turn: dict[Any, list[StepView]] = {}
    for view in steps:
        by_turn.setdefault(view.step.turn_id, []).append(view)
    notes_by_turn: dict[str, list[dict[str, Any]]] = {}
    for note in notes:
        notes_by_turn.setdefault(str(note["turn_id"]), []).append(note)
    return [TurnView(turn=t, steps=by_turn.get(t.id, []), seq=seq, notes=notes_by_turn.get(str(t.id), []))
            for t in turns]


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
