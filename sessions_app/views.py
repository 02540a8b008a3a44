"""Dashboard pages for sessions: overview, list, live timeline, input, cancel, artifacts.

Plain function views: parse, call one service or dashboard read, render. ``request.htmx`` picks
the partial. Live updates come over the WebSocket (consumers.py) as the same partials.
"""

import mimetypes
from pathlib import Path
from urllib.parse import urlencode
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import FileResponse, Http404, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from agentops import health
from agentops.domain import DomainError
from agentops.http import AuthedRequest, HtmxHttpRequest
from agentops.permissions import OPERATE_SESSIONS, VIEW_SESSIONS, has_perm
from sessions_app import dashboard
from sessions_app.engine.commands import session_cancel, session_start, turn_submit
from sessions_app.forms import SessionStartForm
from sessions_app.models import AgentSession, Artifact

ACTIVE_STATUSES = (AgentSession.Status.IN_PROGRESS, AgentSession.Status.AWAITING_APPROVAL,
                   AgentSession.Status.REQUIRES_ACTION)


@require_GET
@login_required
def overview_view(request: AuthedRequest) -> HttpResponse:
    return render(request, "dashboard/overview.html", {"nav": "overview", "ov": dashboard.overview()})


@require_GET
@login_required
def health_panel_view(request: AuthedRequest) -> HttpResponse:
    checks = {"database": health._check_database(), "redis": health._check_redis()}
    checks["workers"] = health._check_workers() if checks["redis"]["ok"] else {"ok": False, "error": "redis down"}
    checks["sandbox"] = health._check_sandbox()
    return render(request, "dashboard/_health.html", {"checks": checks})


def _list_context(request: AuthedRequest) -> dict[str, object]:
    f = {name: request.GET.get(name, "").strip() for name in ("status", "agent", "owner", "q")}
    page = dashboard.sessions_page(status=f["status"], agent=f["agent"], owner=f["owner"], q=f["q"],
                                   page=request.GET.get("page", 1))
    return {"f": f, "page": page, "qs": urlencode({k: v for k, v in f.items() if v})}


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def session_list_view(request: HtmxHttpRequest) -> HttpResponse:
    context = _list_context(request)
    if request.htmx and request.htmx.target == "session-results":
        return render(request, "dashboard/_session_results.html", context)
    return _render_list(request, context, SessionStartForm())


def _render_list(request: AuthedRequest, context: dict[str, object], form: SessionStartForm,
                 status: int = 200) -> HttpResponse:
    context.update(nav="sessions", form=form, statuses=AgentSession.Status.choices,
                   agents=dashboard.agents_for_filter(), owners=dashboard.owners_for_filter(),
                   can_operate=has_perm(request.user, OPERATE_SESSIONS))
    return render(request, "dashboard/session_list.html", context, status=status)


@require_POST
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def session_create_view(request: AuthedRequest) -> HttpResponse:
    form = SessionStartForm(request.POST)
    if form.is_valid():
        try:
            session, _turn = session_start(agent=form.cleaned_data["agent"], owner=request.user,
                                           input=form.cleaned_data["input"], title=form.cleaned_data["title"],
                                           pinned=form.pinned())
        except DomainError as exc:
            form.add_error(None, exc.message)
        else:
            return redirect("session_detail", session_id=session.id)
    return _render_list(request, _list_context(request), form, status=422)


def _session_or_404(session_id: UUID) -> AgentSession:
    session = dashboard.session_for_page(session_id)
    if session is None:
        raise Http404("No such session")
    return session


def _sidebar_context(request: AuthedRequest, session: AgentSession) -> dict[str, object]:
    return {"session": session, "bars": dashboard.usage_bars(session), "active": session.status in ACTIVE_STATUSES,
            "can_operate": has_perm(request.user, OPERATE_SESSIONS)}


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def session_detail_view(request: AuthedRequest, session_id: UUID) -> HttpResponse:
    # The session row (and its last_seq) is read before the timeline: replaying events after
    # last_seq can only bring the page forward, never skip something.
    session = _session_or_404(session_id)
    turns, earlier_before = dashboard.session_timeline(session)
    context = {"nav": "sessions", "turns": turns, "earlier_before": earlier_before,
               "artifacts": dashboard.session_artifacts(session), **_sidebar_context(request, session)}
    return render(request, "dashboard/session_detail.html", context)


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def session_timeline_view(request: AuthedRequest, session_id: UUID) -> HttpResponse:
    """Older turns, for the "load earlier turns" button."""
    session = _session_or_404(session_id)
    try:
        before = int(request.GET.get("before", ""))
    except ValueError:
        before = None
    turns, earlier_before = dashboard.session_timeline(session, before=before)
    return render(request, "dashboard/_timeline_page.html",
                  {"session": session, "turns": turns, "earlier_before": earlier_before})


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def session_sidebar_view(request: AuthedRequest, session_id: UUID) -> HttpResponse:
    session = _session_or_404(session_id)
    return render(request, "dashboard/_sidebar.html", _sidebar_context(request, session))


@require_POST
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def turn_submit_view(request: AuthedRequest, session_id: UUID) -> HttpResponse:
    try:
        turn_submit(session_id=session_id, input=request.POST.get("input", ""), actor=request.user)
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("session_detail", session_id=session_id)


@require_POST
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def session_cancel_view(request: AuthedRequest, session_id: UUID) -> HttpResponse:
    try:
        session_cancel(session_id=session_id, actor=request.user)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "The running turn was cancelled.")
    return redirect("session_detail", session_id=session_id)


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def artifact_download_view(request: AuthedRequest, session_id: UUID, artifact_id: UUID) -> HttpResponseBase:
    artifact = Artifact.objects.filter(pk=artifact_id, session_id=session_id).first()
    if artifact is None:
        raise Http404("No such artifact")
    root = Path(settings.AGENTOPS_ARTIFACT_ROOT).resolve()
    path = (root / artifact.storage_path).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise Http404("The artifact's file is missing")
    guessed = mimetypes.guess_type(artifact.path)[0] or ""
    # Served as an attachment with a non-rendering type: an agent's .html must not run in our origin.
    content_type = guessed if guessed.startswith(("image/png", "image/jpeg", "application/pdf")) else \
        "application/octet-stream"
    return FileResponse(path.open("rb"), as_attachment=True, filename=Path(artifact.path).name,
                        content_type=content_type)
