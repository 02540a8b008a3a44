"""The reviewer's pages: the live queue and the decision page (approve, reject, edit, recover).

Decisions name the request by its ``request_id`` and carry the ``arguments_sha256`` the page
rendered: a page that went stale gets a clear refusal (409) from ``approval_decide``, never a
wrong approval.
"""

import json
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import reswap, retarget

from agentops.domain import DomainError, InvalidArguments, NotFound, PermissionDenied
from agentops.http import AuthedRequest, HtmxHttpRequest
from agentops.pagination import cursor_decode, cursor_encode
from agentops.permissions import DECIDE_APPROVALS, VIEW_APPROVALS, has_perm, require_perm
from approvals_app import selectors
from approvals_app.forms import ApprovalEditForm
from approvals_app.grants import grant_revoke
from approvals_app.models import ApprovalRequest
from approvals_app.presence import presence_token
from approvals_app.services import approval_decide, approval_viewed_record, four_eyes_refusal
from sessions_app import presenters
from sessions_app import selectors as session_selectors
from tools_app.builtin.command import policy_for
from tools_app.selectors import tool_definition_get
from vault_app.selectors import secrets_for_call

RISKS = ("low", "medium", "high")
DECIDED = {"approve": "Approved", "reject": "Rejected", "retry": "Retry approved", "mark_done": "Marked done",
           "fail": "Failed"}
QUEUE_PAGE = 25  # each card costs ~0.5 ms to render: more load as the reviewer scrolls


@require_GET
@login_required
@permission_required(VIEW_APPROVALS, raise_exception=True)
def approval_queue_view(request: HtmxHttpRequest) -> HttpResponse:
    """The pending requests, a page at a time: the next page loads when its marker scrolls into view
    (``after`` = the cursor of the last request shown)."""
    f = {name: request.GET.get(name, "").strip() for name in ("tool", "agent", "risk")}
    order, claim = request.GET.get("order", ""), request.GET.get("claim", "")
    f["order"] = order if order in ("newest", "risk") else "oldest"
    f["claim"] = claim if claim in selectors.CLAIM_FILTERS else "all"
    after_cursor = request.GET.get("after", "")
    try:
        after = cursor_decode(after_cursor, ApprovalRequest) if after_cursor else None
    except InvalidArguments as exc:
        return HttpResponse(exc.message, status=400)
    rows = selectors.approval_queue(user=request.user, order=f["order"], tool=f["tool"], agent=f["agent"],
                                    risk=f["risk"], limit=QUEUE_PAGE + 1, after=after, claim=f["claim"])
    approvals = rows[:QUEUE_PAGE]
    filters = {k: v for k, v in f.items() if v}
    more_url = ("?" + urlencode({**filters, "after": cursor_encode(approvals[-1])})
                if len(rows) > QUEUE_PAGE and f["order"] != "risk" else "")
    context = {"nav": "approvals", "f": f, "approvals": approvals, "more_url": more_url,
               "can_decide": has_perm(request.user, DECIDE_APPROVALS)}
    if after is not None and request.htmx:
        return render(request, "dashboard/_queue_page.html", context)
    context.update(tools=selectors.queue_tools(user=request.user),
                   agents=session_selectors.agents_all(user=request.user), risks=RISKS, now=timezone.now(),
                   claim_filters=selectors.CLAIM_FILTERS,
                   qs_without_order=urlencode({k: v for k, v in filters.items() if k != "order"}))
    return render(request, "dashboard/approval_queue.html", context)


def _edit_form(approval: ApprovalRequest, data: Any = None) -> ApprovalEditForm:
    tool = tool_definition_get(approval.tool_name)
    return ApprovalEditForm(tool.parameters_schema if tool else {"type": "object"}, approval.arguments, data=data)


def _run_command_limits(approval: ApprovalRequest, tool_timeout: int | None) -> list[tuple[str, Any]]:
    requested = approval.arguments.get("timeout_seconds")
    timeout = tool_timeout or 60
    if isinstance(requested, int) and requested > 0:
        timeout = min(requested, timeout)
    policy = policy_for(timeout_seconds=timeout, network=approval.network_policy or "none")
    return [(k, v) for k, v in policy.to_dict().items() if k != "network"]


def _turn_view(approval: ApprovalRequest) -> presenters.TurnView:
    """What the agent was doing: the approval's turn with its steps. Three queries."""
    steps = session_selectors.turn_steps(approval.turn_id)
    cards = presenters.step_views(steps, approvals=selectors.latest_approval_by_step(s.id for s in steps),
                                  streams=session_selectors.streamed_texts(approval.session_id, [s.id for s in steps]))
    return presenters.turn_views([approval.turn], cards)[0]


def _detail(request: AuthedRequest, approval: ApprovalRequest, *, error: str = "",
            error_details: list[str] | None = None, edit_form: ApprovalEditForm | None = None,
            status: int = 200) -> HttpResponse:
    tool = tool_definition_get(approval.tool_name)
    schema = tool.parameters_schema if tool else {"type": "object"}
    context = {
        "nav": "approvals", "approval": approval, "now": timezone.now(), "error": error,
        "error_details": error_details or [], "edit_open": edit_form is not None,
        "can_decide": four_eyes_refusal(approval, request.user) is None,
        "audit": selectors.audit_of(approval.request_id), 
        "presence_token": presence_token(approval),
        "edit_form": edit_form or ApprovalEditForm(schema, approval.arguments),
        "limits": _run_command_limits(approval, tool.timeout_seconds if tool else None)
        if approval.tool_name == "run_command" else [],
        "diff": presenters.diff_lines(approval.preview), "tv": _turn_view(approval),
        "secrets": secrets_for_call(team_id=approval.session.team_id, tool_name=approval.tool_name,
                                    arguments=approval.edited_arguments or approval.arguments,
                                    env=(approval.run_spec or {}).get("env") or {}),
    }
    return render(request, "dashboard/approval_detail.html", context, status=status)


def _approval_or_404(request: AuthedRequest, request_id: UUID) -> ApprovalRequest:
    try:
        return selectors.approval_get_for_page(request_id, user=request.user)
    except NotFound as exc:
        raise Http404("No such approval request") from exc


@require_GET
@never_cache  # Back after a decision showed the request still pending, with a working Approve
@login_required
@permission_required(VIEW_APPROVALS, raise_exception=True)
def approval_detail_view(request: AuthedRequest, request_id: UUID) -> HttpResponse:
    approval = _approval_or_404(request, request_id)
    approval_viewed_record(approval=approval, actor=request.user)
    return _detail(request, approval)


@require_POST
@login_required
def approval_decide_view(request: HtmxHttpRequest, request_id: UUID) -> HttpResponse:
    approval = _approval_or_404(request, request_id)
    decided_before = approval.status != ApprovalRequest.Status.PENDING  # this post is a replay
    from_queue = request.POST.get("from") == "queue" and request.htmx
    seen_hash = request.POST.get("arguments_sha256", "")
    decision = request.POST.get("decision", "")
    edit_form = _edit_form(approval, data=request.POST) if request.POST.get("edit") == "1" else None
    try:
        require_perm(request.user, DECIDE_APPROVALS)
        if not seen_hash:
            raise InvalidArguments("The form did not say which arguments you saw; reload the page.")
        if decision == ApprovalRequest.Decision.REJECT and not request.POST.get("reason", "").strip() \
                and not decided_before:
            raise InvalidArguments("Say why you reject it (the model is told); nothing was decided.")
        if edit_form is not None and not edit_form.is_valid():
            lines = edit_form.error_lines()
            raise InvalidArguments("; ".join(lines), details={"errors": lines})
        decided = approval_decide(request_id=request_id, actor=request.user,
                                  grant_pattern=_grant_pattern(request.POST.get("grant_pattern", "")),
                                  decision=decision, reason=request.POST.get("reason", ""),
                                  seen_hash=seen_hash,
                                  arguments=edit_form.edited_arguments() if edit_form is not None else None,
                                  remember=request.POST.get("remember") == "1")
    except DomainError as exc:
        message = _explain(exc)
        details = [str(e) for e in exc.details.get("errors", [])] if isinstance(exc.details.get("errors"), list) else []
        if from_queue:
            # The decision did not happen: show the message in the item itself.
            response = render(request, "dashboard/_queue_item.html",
                              {"approval": approval, "can_decide": True, "error": message}, status=exc.status)
            return reswap(retarget(response, f"#approval-{approval.request_id}"), "outerHTML")
        approval = _approval_or_404(request, request_id)  # show what is current now
        return _detail(request, approval, error=message, error_details=details, edit_form=edit_form,
                       status=exc.status)
    if decided.status == ApprovalRequest.Status.PENDING:  # a vote short of the quorum
        note = f"Your approval is recorded; {decided.required_approvals} distinct approvals are required."
        if from_queue:
            fresh = selectors.approvals_by_request_id([request_id])[str(request_id)]
            response = render(request, "dashboard/_queue_item.html", {"approval": fresh, "can_decide": True,
                                                                      "error": note})
            return reswap(retarget(response, f"#approval-{request_id}"), "outerHTML")
        messages.success(request, note)
        return redirect("approval_detail", request_id=request_id)
    verb = DECIDED.get(decided.decision, decided.decision)
    by_another = decided.decided_by_id is not None and decided.decided_by_id != request.user.pk
    if decided_before or by_another:  # nothing was decided by this post: say by whom it was
        who = decided.decided_by.get_username() if decided.decided_by else "someone"
        when = timezone.localtime(decided.decided_at).strftime("%H:%M") if decided.decided_at else ""
        note = f"Already decided: {verb.lower()} by {who}{f' at {when}' if when else ''}. Nothing more was done."
        if from_queue:
            return render(request, "dashboard/_queue_decided.html", {"approval": decided, "verb": verb, "note": note})
        messages.info(request, note)
        return redirect("approval_queue")
    if from_queue:
        return render(request, "dashboard/_queue_decided.html", {"approval": decided, "verb": verb})
    messages.success(request, f"{verb}: {decided.tool_name} in {approval.session}.")
    return redirect("approval_queue")


def _explain(exc: DomainError) -> str:
    if exc.code == "stale_arguments":
        return ("This page is out of date: the request changed since you opened it. Nothing was approved. "
                "Review the current arguments below and decide again.")
    return exc.message


def _grant_pattern(text: str) -> dict[str, str] | None:
    """The form's grant pattern: a JSON object {argument: glob}; empty = the exact arguments."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArguments('The grant pattern must be JSON, e.g. {"path": "notes/*"}.',
                               details={"field": "grant_pattern"}) from exc
    if not isinstance(value, dict):
        raise InvalidArguments("The grant pattern must be a JSON object.", details={"field": "grant_pattern"})
    return value


@require_POST
@login_required
def grant_revoke_view(request: HtmxHttpRequest, grant_id: int) -> HttpResponse:
    try:
        grant = selectors.grant_get(grant_id, user=request.user)
    except NotFound as exc:
        raise Http404("No such grant") from exc
    try:
        grant_revoke(grant_id=grant.pk, actor=request.user)
    except PermissionDenied as exc:
        raise DjangoPermissionDenied(exc.message) from exc
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Revoked the grant of {grant.tool_name}.")
    return redirect("session_detail", session_id=grant.session_id)
