"""The reviewer's workflow pages: claim and release a request, and approve identical requests in
bulk. Each parses, calls one service and shapes the answer (an htmx request gets a status and a
message; the live update comes over the queue's WebSocket)."""

from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from agentops.domain import DomainError, NotFound, PermissionDenied
from agentops.http import HtmxHttpRequest
from agentops.permissions import DECIDE_APPROVALS, VIEW_APPROVALS, require_perm
from approvals_app import selectors
from approvals_app.assignment import approval_claim, approval_release
from approvals_app.bulk import approval_bulk_approve


def _visible(request: HtmxHttpRequest, request_id: UUID) -> None:
    try:
        selectors.approval_get(request_id, user=request.user)
    except NotFound as exc:
        raise Http404("No such approval request") from exc


def _answer(request: HtmxHttpRequest, request_id: UUID, exc: DomainError | None, done: str) -> HttpResponse:
    if isinstance(exc, PermissionDenied) and not request.htmx:
        raise DjangoPermissionDenied(exc.message)
    if request.htmx:
        return HttpResponse(exc.message if exc else done, status=exc.status if exc else 200, content_type="text/plain")
    if exc is not None:
        messages.error(request, exc.message)
    else:
        messages.success(request, done)
    return redirect("approval_detail", request_id=request_id)


@require_POST
@login_required
def approval_claim_view(request: HtmxHttpRequest, request_id: UUID) -> HttpResponse:
    _visible(request, request_id)
    try:
        require_perm(request.user, DECIDE_APPROVALS)
        approval_claim(request_id=request_id, actor=request.user)
    except DomainError as exc:
        return _answer(request, request_id, exc, "")
    return _answer(request, request_id, None, "You claimed this request.")


@require_POST
@login_required
def approval_release_view(request: HtmxHttpRequest, request_id: UUID) -> HttpResponse:
    _visible(request, request_id)
    try:
        approval_release(request_id=request_id, actor=request.user)
    except DomainError as exc:
        return _answer(request, request_id, exc, "")
    return _answer(request, request_id, None, "You released this request.")


BULK_OUTCOMES = "approval_bulk_outcomes"  # the last group's outcomes, shown once after the redirect


@require_http_methods(["GET", "POST"])
@login_required
@permission_required(VIEW_APPROVALS, raise_exception=True)
def approval_bulk_view(request: HtmxHttpRequest) -> HttpResponse:
    """GET: the groups of identical pending requests, and what the last approval of a group did.
    POST: approve one group (``request_id`` many times, ``arguments_sha256``), then back to GET
    (a reload posted the group again: "Approved 0 of 29")."""
    status = 200
    if request.method == "POST":
        try:
            require_perm(request.user, DECIDE_APPROVALS)
            outcomes = approval_bulk_approve(request_ids=request.POST.getlist("request_id"), actor=request.user,
                                             arguments_sha256=request.POST.get("arguments_sha256", ""),
                                             reason=request.POST.get("reason", ""))
        except DomainError as exc:
            messages.error(request, exc.message)
            status = exc.status
        else:
            approved = sum(1 for v in outcomes.values() if v == "approved")
            voted = sum(1 for v in outcomes.values() if v == "pending")  # a quorum still short of its approvals
            text = f"Approved {approved} of {len(outcomes)} identical requests, each on its own."
            if voted:
                text += (f" Your approval counted on {voted} more, which wait for "
                         f"{'another reviewer' if voted == 1 else 'other reviewers'} (quorum).")
            messages.success(request, text)
            request.session[BULK_OUTCOMES] = outcomes
            return redirect("approval_bulk")
    described = selectors.outcomes_described(request.session.pop(BULK_OUTCOMES, {}), user=request.user)
    groups = []
    for g in selectors.identical_pending_groups(user=request.user):
        rows = selectors.pending_identical(user=request.user, tool=g["tool_name"],
                                           arguments_sha256=g["arguments_sha256"], policy_id=g["policy_id"])
        if rows:
            groups.append({"tool": g["tool_name"], "sha": g["arguments_sha256"], "rows": rows,
                           "arguments": rows[0].arguments, "policy": rows[0].policy_reason})
    return render(request, "dashboard/approval_bulk.html",
                  {"nav": "approvals", "groups": groups, "outcomes": described}, status=status)


