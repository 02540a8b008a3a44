"""HTML fragments for live events, rendered once by the sender and carried in the group message.

A fragment is a list of ``<template data-op=… data-target=…>`` instructions that static/js/live.js
applies to whatever page is open: ``upsert`` (replace the element ``data-id`` or insert it into the
target), ``replace`` (the target element; skipped when the page already shows a newer copy, by
``data-seq``), ``remove`` (the element ``data-id``) and ``append-text`` (a streaming answer).
Targets absent from the page are skipped, so one fragment serves the session timeline, the
approval queue and the decision page. The content comes from the same template partials the pages
render, built from the same view models (``presenters``).
"""

import re
import uuid
from typing import Any

from django.template.loader import get_template, render_to_string
from django.urls import get_resolver
from django.utils import formats
from django.utils.html import escape

from approvals_app import selectors as approval_selectors
from sessions_app import hooks, presenters, selectors
from sessions_app.models import Step, Turn

STEP_PREFIXES = ("model.", "tool.", "approval.", "step.", "compaction.", "verification.")
STREAMED = ("model.delta", "tool.progress")
# Events of a step that do not carry a step prefix: the compaction and verification cards' outcomes.
STEP_TYPES = ("session.compacted", "turn.verified")
NOTE_TYPES = selectors.NOTE_TYPES
TURN_TYPES = ("turn.queued", "turn.started", "turn.completed", "turn.failed", "turn.cancelled",
              "turn.awaiting_approval", "turn.requires_action")
QUEUE_REMOVALS = ("approval.decided", "approval.expired", "approval.cancelled")
# Events that (re)render the request's queue item and its review card (claims, votes, escalation).
QUEUE_UPSERTS = ("approval.requested", "approval.voted", "approval.claimed", "approval.released",
                 "approval.escalated")
# Events after which the sidebar (usage bars, the input and cancel controls) shows something new.
SIDEBAR_TYPES = re.compile(r"^(turn\.|tool\.(completed|failed|rejected|expired|cancelled)$|model\.completed$"
                           r"|budget\.|session\.(status_changed|compacted|compact_requested)$)")
# Of those, the ones that change only the counters: they push the usage card alone (most of a
# running turn's events: the whole sidebar, with its forms, was the dearest template of a step).
USAGE_TYPES = re.compile(r"^(tool\.(completed|failed|rejected|expired|cancelled)|model\.completed)$")


def _op(op: str, target: str, content: str = "", *, seq: int = 0, dom_id: str = "") -> str:
    attrs = f'data-op="{escape(op)}" data-target="{escape(target)}" data-seq="{seq}"'
    if dom_id:
        attrs += f' data-id="{escape(dom_id)}"'
    return f"<template {attrs}>{content}</template>"


TEMPLATES = ("_step.html", "_turn.html", "_turn_head.html", "_turn_foot.html", "_sidebar.html", "_usage.html",
             "_progress.html", "_session_status.html", "_artifact.html", "_notice.html", "_session_note.html",
             "_queue_item.html", "_review_card.html", "_decided_notice.html")


def warm_up(recent: int = 40) -> None:
    """Do before the first live event what its rendering would do first: compile the fragments'
    templates (and load their tags), fill the URL resolver, compile the batch reads, and render
    the ``recent`` newest stored events (their fragments are thrown away). An announcer that
    started cold took hundreds of milliseconds over its first batch: the load proof's first
    deliveries were its slowest.

    The resolver is filled here even when nothing is stored yet (a new install, the benchmark's
    fresh database): the fragments' ``{% url %}`` tags otherwise filled it on the first render,
    ~50 ms of CPU, and each of a web process's read threads that rendered before it was filled
    filled it again; six WebSockets opened at once on a busy machine read their backlogs in ~1 s
    each (bench/concurrency.py, N = 300 with 200 watchers)."""
    for name in TEMPLATES:
        get_template(f"dashboard/{name}")
    get_resolver().reverse_dict  # noqa: B018 (the property fills the resolver's tables for reverse())
    formats.get_format("DATETIME_FORMAT")  # the locale's formats module, imported on first use
    selectors.live_rows(step_ids=[uuid.uuid4()], turn_ids=[uuid.uuid4()], session_ids=[uuid.uuid4()])
    render_event_fragments(selectors.newest_events(recent))


def render_event_fragment(event: dict[str, Any]) -> str:
    """The fragment of one stored event (``Event.as_dict()``)."""
    return render_event_fragments([event])[0]


def render_event_fragments(events: list[dict[str, Any]]) -> list[str]:
    """Fragments of many events with their rows fetched in bulk: the steps, turns and sidebar
    sessions in one round trip (``selectors.live_rows``), then, only when the batch has any, the
    approvals of steps ever asked about and the queue items; none for deltas.

    The sidebar is rendered once per session per call, from the session row as it is now, and rides
    on that session's last event here that changes it: a batch of a hundred tool events costs one
    sidebar, and the page never re-fetches it. Where the batch's events change only the counters
    (``USAGE_TYPES``), that is the usage card alone. A step's card likewise rides on its last event here
    (live.js applies a batch's fragments in seq order, and a resend's range is rendered as one call).
    """
    step_ids = {e["step_id"] for e in events if e.get("step_id") and _is_step_event(e)}
    turn_ids = {e["turn_id"] for e in events if e.get("turn_id") and e["type"] in TURN_TYPES}
    request_ids = {(e.get("payload") or {}).get("request_id") for e in events if e["type"] in QUEUE_UPSERTS}
    sidebar_at = {str(e["session_id"]): i for i, e in enumerate(events) if SIDEBAR_TYPES.match(e["type"])}
    rows = selectors.live_rows(step_ids=step_ids, turn_ids=turn_ids, session_ids=sidebar_at)
    steps = _step_views(rows.steps)
    turns = rows.turns
    approvals = approval_selectors.approvals_by_request_id(r for r in request_ids if r)
    # A card shows its step as it is now, so only the step's last event here carries it (of those
    # sent to the same groups: an approval event also reaches the reviewers' queue): the engine
    # commits a model reply, the tool call's start and end and the next model call together, and
    # the tool's card rendered twice identically was a quarter of the announcer's rendering.
    card_at = {_card_key(e): i for i, e in enumerate(events) if e.get("step_id") and _is_step_event(e)}
    htmls = [_render(e, steps=steps, turns=turns, approvals=approvals,
                     card=bool(e.get("step_id")) and card_at.get(_card_key(e)) == i)
             for i, e in enumerate(events)]
    for i, e in enumerate(events):
        extra = hooks.EVENT_FRAGMENTS.get(e["type"])
        if extra is not None:  # the subagents' cards (fanout_app)
            htmls[i] += extra(e)
    whole = {str(e["session_id"]) for e in events
             if SIDEBAR_TYPES.match(e["type"]) and not USAGE_TYPES.match(e["type"])}
    for session_id, i in sidebar_at.items():
        session = rows.sessions.get(session_id)
        if session is None:
            continue
        context = presenters.sidebar_context(session, can_operate=False, live=True)
        if session_id in whole:
            htmls[i] += _op("replace", "#sidebar", render_to_string("dashboard/_sidebar.html", context),
                            seq=int(events[i]["seq"]))
        else:
            htmls[i] += _op("replace", "#usage", render_to_string("dashboard/_usage.html", context),
                            seq=int(events[i]["seq"]))
    return htmls


def _card_key(event: dict[str, Any]) -> tuple[str, bool]:
    """Events with the same key share one card in a batch: the same step, sent to the same groups."""
    return str(event.get("step_id")), str(event["type"]).startswith("approval.")


def _is_step_event(event: dict[str, Any]) -> bool:
    """An event that re-renders its step's card (streamed output is appended instead)."""
    return event["type"] not in STREAMED and (event["type"].startswith(STEP_PREFIXES) or event["type"] in STEP_TYPES)


def _step_views(steps: dict[str, Step]) -> dict[str, presenters.StepView]:
    """Cards of these steps, each with its latest approval request: read only for the steps ever
    asked about (most, model calls and read-only tools, never were)."""
    asked = [s.id for s in steps.values() if getattr(s, "asked", True)]
    approvals = approval_selectors.latest_approval_by_step(asked)
    return dict(zip(steps, presenters.step_views(list(steps.values()), approvals=approvals), strict=True))


def _render(event: dict[str, Any], *, steps: dict[str, presenters.StepView], turns: dict[str, Turn],
            approvals: dict[str, Any], card: bool = True) -> str:
    etype, seq = event["type"], int(event["seq"])
    payload = event.get("payload") or {}
    turn_id, step_id = event.get("turn_id"), event.get("step_id")
    ops: list[str] = []
    if etype == "model.delta" and step_id:
        ops.append(_op("append-text", f"#step-{step_id}-stream", escape(str(payload.get("text", ""))), seq=seq))
    elif etype == "tool.progress" and step_id:
        text = str(payload.get("stdout", "")) + str(payload.get("stderr", ""))
        if isinstance(payload.get("progress"), dict):
            html = render_to_string("dashboard/_progress.html",
                                    {"step_id": step_id, "progress": payload["progress"], "seq": seq})
            ops.append(_op("replace", f"#step-{step_id}-progress", html, seq=seq))
        if text:
            ops.append(_op("append-text", f"#step-{step_id}-live", escape(text), seq=seq))
    elif etype == "session.status_changed":
        html = render_to_string("dashboard/_session_status.html", {"status": payload.get("status", "")})
        ops.append(_op("replace", "#session-status", html, seq=seq))
    elif etype in TURN_TYPES and turn_id and str(turn_id) in turns:
        tv = presenters.TurnView(turn=turns[str(turn_id)], seq=seq)
        if etype == "turn.queued":
            html = render_to_string("dashboard/_turn.html", {"tv": tv})
            ops.append(_op("upsert", "#timeline", html, seq=seq, dom_id=tv.dom_id))
        else:
            ops.append(_op("replace", f"#turn-{turn_id}-head",
                           render_to_string("dashboard/_turn_head.html", {"tv": tv}), seq=seq))
            ops.append(_op("replace", f"#turn-{turn_id}-foot",
                           render_to_string("dashboard/_turn_foot.html", {"tv": tv}), seq=seq))
    elif etype == "artifact.published":
        html = render_to_string("dashboard/_artifact.html", {
            "artifact": {"id": payload.get("artifact_id"), "path": payload.get("path"), "size": payload.get("size"),
                         "sha256": payload.get("sha256"), "session_id": event["session_id"]}})
        ops.append(_op("upsert", "#artifacts", html, seq=seq, dom_id=f"artifact-{payload.get('artifact_id')}"))
    elif etype == "budget.exceeded" and turn_id:
        html = render_to_string("dashboard/_notice.html", {"event": event})
        ops.append(_op("upsert", f"#turn-{turn_id}-items", html, seq=seq, dom_id=f"event-{seq}"))
    elif etype in NOTE_TYPES and turn_id:
        html = render_to_string("dashboard/_session_note.html", {"event": event})
        ops.append(_op("upsert", f"#turn-{turn_id}-items", html, seq=seq, dom_id=f"event-{seq}"))
    if card and _is_step_event(event) and step_id and str(step_id) in steps:
        sv = steps[str(step_id)]
        sv.seq = seq
        html = render_to_string("dashboard/_step.html", {"sv": sv})
        ops.append(_op("upsert", f"#turn-{sv.step.turn_id}-items", html, seq=seq, dom_id=sv.dom_id))
    if etype in QUEUE_UPSERTS:
        approval = approvals.get(str(payload.get("request_id")))
        if approval is not None and approval.status == "pending":
            context = {"approval": approval, "can_decide": True, "live": True, "seq": seq}
            html = render_to_string("dashboard/_queue_item.html", context)
            ops.append(_op("upsert", "#approval-queue", html, seq=seq, dom_id=f"approval-{approval.request_id}"))
            if etype != "approval.requested":
                html = render_to_string("dashboard/_review_card.html", context)
                ops.append(_op("replace", f"#review-{approval.request_id}", html, seq=seq))
    elif etype in QUEUE_REMOVALS:
        rid = payload.get("request_id")
        ops.append(_op("remove", "#approval-queue", seq=seq, dom_id=f"approval-{rid}"))
        html = render_to_string("dashboard/_decided_notice.html", {"payload": payload, "type": etype})
        ops.append(_op("replace", f"#decision-live-{rid}", html, seq=seq))
    return "".join(ops)
