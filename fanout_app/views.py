"""Batch pages: the list, the start form (paste or upload), and a batch's live progress (htmx polling)."""

import json
from typing import Any
from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agentops.domain import DomainError, NotFound, PermissionDenied
from agentops.http import AuthedRequest, HtmxHttpRequest
from agentops.permissions import OPERATE_SESSIONS, VIEW_SESSIONS, has_perm
from fanout_app import batches, selectors
from fanout_app.demo_airline import AIRLINE_AGENT
from fanout_app.forms import BatchStartForm
from scripted_model.scenarios_airline import AIRLINE_CASES
from sessions_app import selectors as session_selectors


def _list(request: AuthedRequest, form: BatchStartForm, status: int = 200) -> HttpResponse:
    agents = session_selectors.agents_to_start(user=request.user)
    # The airline demo in one click: its cases as a batch of the rebooking desk (when it is seeded).
    airline = json.dumps(AIRLINE_CASES) if agents.filter(slug=AIRLINE_AGENT).exists() else ""
    return render(request, "fanout/batch_list.html",
                  {"nav": "batches", "form": form, "batches": selectors.batches_list(user=request.user)[:50],
                   "can_operate": has_perm(request.user, OPERATE_SESSIONS), "airline_rows": airline,
                   "airline_agent": AIRLINE_AGENT, "has_agents": agents.exists()}, status=status)


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def batch_list_view(request: AuthedRequest) -> HttpResponse:
    return _list(request, BatchStartForm(agents=session_selectors.agents_to_start(user=request.user)))


@require_http_methods(["GET", "POST"])
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def batch_create_view(request: AuthedRequest) -> HttpResponse:
    if request.method == "GET":  # the address bar shows this URL after a form sent back with errors
        return redirect("batch_list")
    form = BatchStartForm(request.POST, request.FILES, agents=session_selectors.agents_to_start(user=request.user))
    if form.is_valid():
        try:
            batch, _created = batches.batch_create(agent=form.cleaned_data["agent"], owner=request.user,
                                                   rows=form.cleaned_data["parsed_rows"],
                                                   title=form.cleaned_data["title"])
        except DomainError as exc:
            form.add_error(None, exc.message)
        else:
            return redirect("batch_detail", batch_id=batch.id)
    return _list(request, form, status=422)


def _batch_or_404(request: AuthedRequest, batch_id: UUID) -> Any:
    try:
        return selectors.batch_get(batch_id, user=request.user)
    except NotFound as exc:
        raise Http404("No such batch") from exc


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def batch_detail_view(request: HtmxHttpRequest, batch_id: UUID) -> HttpResponse:
    batch = _batch_or_404(request, batch_id)
    context = {"nav": "batches", "batch": batch, "progress": selectors.batch_progress(batch),
               "members": selectors.batch_members(batch), "can_operate": has_perm(request.user, OPERATE_SESSIONS)}
    if request.htmx:
        return render(request, "fanout/_batch_progress.html", context)
    return render(request, "fanout/batch_detail.html", context)


@require_POST
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def batch_cancel_view(request: AuthedRequest, batch_id: UUID) -> HttpResponse:
    batch = _batch_or_404(request, batch_id)
    try:
        cancelled = batches.batch_cancel(batch=batch, actor=request.user)
    except PermissionDenied as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Cancelled the running turn of {cancelled} session{'s' if cancelled != 1 else ''}."
                         if cancelled else "Nothing to cancel: no session of this batch was working.")
    return redirect("batch_detail", batch_id=batch.id)


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def subagent_children_view(request: AuthedRequest, session_id: UUID) -> HttpResponse:
    """A parent's subagent cards, polled by the session page while a child is still working (its
    status changes, e.g. to awaiting approval, are the child's events, not the parent's)."""
    try:
        session = session_selectors.session_get(session_id, user=request.user)
    except NotFound as exc:
        raise Http404("No such session") from exc
    return render(request, "fanout/_children.html",
                  {"children": selectors.subagent_children(session.id), "session_id": session.id})
