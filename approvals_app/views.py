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
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from agentops.domain import DomainError, InvalidArguments
from agentops.http import AuthedRequest, HtmxHttpRequest
from agentops.permissions import DECIDE_APPROVALS, VIEW_APPROVALS, has_perm, require_perm
from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_decide
from sessions_app import dashboard

RISKS = ("low", "medium", "high")
LONG_TEXT_FIELDS = ("command", "content", "body", "text")


@require_GET
@login_required
@permission_required(VIEW_APPROVALS, raise_exception=True)
def approval_queue_view(request: AuthedRequest) -> HttpResponse:
    f = {name: request.GET.get(name, "").strip() for name in ("tool", "agent", "risk")}
    f["order"] = "newest" if request.GET.get("order") == "newest" else "oldest"
    approvals = dashboard.approval_queue(order=f["order"], tool=f["tool"], agent=f["agent"], risk=f["risk"])
    context = {"nav": "approvals", "f": f, "approvals": approvals, "tools": dashboard.queue_tools(),
               "agents": dashboard.agents_for_filter(), "risks": RISKS, "now": timezone.now(),
               "can_decide": has_perm(request.user, DECIDE_APPROVALS),
               "qs_without_order": urlencode({k: v for k, v in f.items() if v and k != "order"})}
    return render(request, "dashboard/approval_queue.html", context)


# --- the edit form, built from the tool's JSON schema --------------------------------------

def _field_kind(name: str, spec: dict[str, Any], value: Any) -> str:
    kind = spec.get("type")
    if kind == "string":
        long = name in LONG_TEXT_FIELDS or int(spec.get("maxLength") or 0) > 500
        return "textarea" if long or (isinstance(value, str) and "\n" in value) else "text"
    if kind in ("integer", "number"):
        return "number"
    if kind == "boolean":
        return "bool"
    return "json"


def _field_value(kind: str, value: Any) -> str:
    if value is None:
        return ""
    if kind == "bool":
        return "true" if value else "false"
    if kind == "json":
        return dashboard.pretty_json(value)
    return str(value)


def edit_fields(schema: dict[str, Any], arguments: dict[str, Any]) -> list[dict[str, Any]]:
    properties: dict[str, Any] = dict(schema.get("properties") or {})
    for name in arguments:
        properties.setdefault(name, {})  # arguments the schema does not describe stay editable (as JSON)
    required = set(schema.get("required") or [])
    fields = []
    for name, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        kind = _field_kind(name, spec, arguments.get(name))
        fields.append({"name": name, "kind": kind, "spec": spec, "required": name in required,
                       "description": str(spec.get("description", ""))[:200],
                       "value": _field_value(kind, arguments.get(name))})
    return fields


def parse_edit_fields(fields: list[dict[str, Any]], data: QueryDict) -> dict[str, Any]:
    """The edited arguments, typed by the schema; ``approval_decide`` validates them again."""
    arguments: dict[str, Any] = {}
    for field in fields:
        name, kind = field["name"], field["kind"]
        raw = data.get(f"arg__{name}")
        if raw is None:
            continue
        raw = raw.replace("\r\n", "\n")  # browsers send textarea lines with CRLF
        if raw == "" and not (kind in ("text", "textarea") and field["required"]):
            continue
        try:
            if kind == "number":
                arguments[name] = int(raw) if field["spec"].get("type") == "integer" else float(raw)
            elif kind == "bool":
                arguments[name] = raw == "true"
            elif kind == "json":
                arguments[name] = json.loads(raw)
            else:
                arguments[name] = raw
        except ValueError as exc:
            raise InvalidArguments(f"{name}: {exc}", details={"errors": [f"{name}: not a valid {kind} value"]}) \
                from exc
    return arguments


# --- the decision page ---------------------------------------------------------------------

def _run_command_limits(approval: ApprovalRequest, tool_timeout: int | None) -> list[tuple[str, Any]]:
    try:
        from tools_app.builtin.command import policy_for
    except ImportError:
        return []
    requested = approval.arguments.get("timeout_seconds")
    timeout = tool_timeout or 60
    if isinstance(requested, int) and requested > 0:
        timeout = min(requested, timeout)
    policy = policy_for(timeout_seconds=timeout, network=approval.network_policy or "none")
    return [(k, v) for k, v in policy.to_dict().items() if k != "network"]


def _detail(request: AuthedRequest, approval: ApprovalRequest, *, error: str = "",
            error_details: list[str] | None = None, edit_open: bool = False, status: int = 200) -> HttpResponse:
    tool = dashboard.tool_definition(approval.tool_name)
    schema = tool.parameters_schema if tool else {"type": "object"}
    context = {
        "nav": "approvals", "approval": approval, "now": timezone.now(), "error": error,
        "error_details": error_details or [], "edit_open": edit_open,
        "can_decide": has_perm(request.user, DECIDE_APPROVALS),
        "edit_fields": edit_fields(schema, approval.arguments),
        "limits": _run_command_limits(approval, tool.timeout_seconds if tool else None)
        if approval.tool_name == "run_command" else [],
        "diff": dashboard.diff_lines(approval.preview), "tv": dashboard.turn_view(approval.turn),
    }
    return render(request, "dashboard/approval_detail.html", context, status=status)


def _approval_or_404(request_id: UUID) -> ApprovalRequest:
    approval = dashboard.approval_for_page(request_id)
    if approval is None:
        raise Http404("No such approval request")
    return approval


@require_GET
@login_required
@permission_required(VIEW_APPROVALS, raise_exception=True)
def approval_detail_view(request: AuthedRequest, request_id: UUID) -> HttpResponse:
    return _detail(request, _approval_or_404(request_id))


@require_POST
@login_required
def approval_decide_view(request: HtmxHttpRequest, request_id: UUID) -> HttpResponse:
    approval = _approval_or_404(request_id)
    from_queue = request.POST.get("from") == "queue" and request.htmx
    seen_hash = request.POST.get("arguments_sha256", "")
    editing = request.POST.get("edit") == "1"
    try:
        require_perm(request.user, DECIDE_APPROVALS)
        if not seen_hash:
            raise InvalidArguments("The form did not say which arguments you saw; reload the page.")
        arguments = None
        if editing:
            tool = dashboard.tool_definition(approval.tool_name)
            fields = edit_fields(tool.parameters_schema if tool else {"type": "object"}, approval.arguments)
            arguments = parse_edit_fields(fields, request.POST)
        decided = approval_decide(request_id=request_id, actor=request.user,
                                  decision=request.POST.get("decision", ""), reason=request.POST.get("reason", ""),
                                  seen_hash=seen_hash, arguments=arguments,
                                  remember=request.POST.get("remember") == "1")
    except DomainError as exc:
        message = _explain(exc)
        details = [str(e) for e in exc.details.get("errors", [])] if isinstance(exc.details.get("errors"), list) else []
        if from_queue:
            # The decision did not happen: show the message in the item itself.
            response = render(request, "dashboard/_queue_item.html",
                              {"approval": approval, "can_decide": True, "error": message}, status=exc.status)
            response["HX-Retarget"] = f"#approval-{approval.request_id}"
            response["HX-Reswap"] = "outerHTML"
            return response
        approval = _approval_or_404(request_id)  # show what is current now
        return _detail(request, approval, error=message, error_details=details, edit_open=editing, status=exc.status)
    if from_queue:
        return render(request, "dashboard/_queue_decided.html", {"approval": decided})
    verb = {"approve": "Approved", "reject": "Rejected", "retry": "Retry approved", "mark_done": "Marked done",
            "fail": "Failed"}.get(decided.decision, decided.decision)
    messages.success(request, f"{verb}: {decided.tool_name} in {approval.session}.")
    return redirect("approval_queue")


def _explain(exc: DomainError) -> str:
    if exc.code == "stale_arguments":
        return ("This page is out of date: the request changed since you opened it. Nothing was approved. "
                "Review the current arguments below and decide again.")
    return exc.message
