"""Dashboard pages for sessions: overview, list, live timeline, input, cancel, artifacts.

Plain function views: parse, call one service or selector, build the view models, render.
``request.htmx`` picks the partial. Live updates come over the WebSocket (consumers.py) as the
same partials, the sidebar included: the page never polls.
"""

from collections.abc import Callable
from datetime import timedelta
from urllib.parse import urlencode
from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from agentops.domain import DomainError, NotFound, PermissionDenied
from agentops.health import health_checks
from agentops.http import AuthedRequest, HtmxHttpRequest
from agentops.permissions import DECIDE_APPROVALS, OPERATE_SESSIONS, VIEW_SESSIONS, has_perm
from agentops.teams import REVIEW_ROLES, has_team_role
from approvals_app import selectors as approval_selectors
from sessions_app import presenters, selectors
from sessions_app.downloads import artifact_response
from sessions_app.engine.commands import session_cancel, session_start, turn_retry, turn_submit
from sessions_app.forms import BudgetRaiseForm, SessionPinnedForm, SessionStartForm
from sessions_app.models import AgentSession
from sessions_app.services import session_budget_raise, session_compact_request, session_pinned_update

STUCK_AFTER_MINUTES = 10
TURNS_PER_PAGE = 5
SESSIONS_PER_PAGE = 25
ARTIFACTS_LIMIT = 100


@require_GET
@login_required
def overview_view(request: AuthedRequest) -> HttpResponse:
    pending, oldest = approval_selectors.pending_summary(user=request.user)
    quiet_for = timedelta(minutes=STUCK_AFTER_MINUTES)
    user = request.user
    now = timezone.now()
    stuck = selectors.sessions_stuck(user=user, now=now, quiet_for=quiet_for)
    rows = presenters.stuck_rows(stuck, selectors.steps_blocking([s.id for s in stuck]), now=now)
    ov = presenters.Overview(counts=selectors.session_status_counts(user=user), pending_approvals=pending,
                             oldest_pending=oldest, stuck=rows, recent=selectors.sessions_recent(user=user),
                             stuck_minutes=STUCK_AFTER_MINUTES)
    return render(request, "dashboard/overview.html", {"nav": "overview", "ov": ov})


@require_GET
@login_required
def health_panel_view(request: AuthedRequest) -> HttpResponse:
    return render(request, "dashboard/_health.html", {"checks": health_checks()})


def _list_context(request: AuthedRequest) -> dict[str, object]:
    f = {name: request.GET.get(name, "").strip() for name in ("status", "agent", "owner", "q", "batch")}
    page = selectors.sessions_page(user=request.user, status=f["status"], agent=f["agent"], owner=f["owner"], q=f["q"],
                                   page=request.GET.get("page", 1), per_page=SESSIONS_PER_PAGE, batch=f["batch"])
    return {"f": f, "page": page, "qs": urlencode({k: v for k, v in f.items() if v})}


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def session_list_view(request: HtmxHttpRequest) -> HttpResponse:
    context = _list_context(request)
    if request.htmx and request.htmx.target == "session-results":
        return render(request, "dashboard/_session_results.html", context)
    return _render_list(request, context, SessionStartForm(agents=selectors.agents_to_start(user=request.user)))


def _render_list(request: AuthedRequest, context: dict[str, object], form: SessionStartForm,
                 status: int = 200) -> HttpResponse:
    context.update(nav="sessions", form=form, statuses=AgentSession.Status.choices,
                   agents=selectors.agents_all(user=request.user), owners=selectors.session_owners(user=request.user),
                   can_operate=has_perm(request.user, OPERATE_SESSIONS))
    return render(request, "dashboard/session_list.html", context, status=status)


@require_http_methods(["GET", "POST"])
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def session_create_view(request: AuthedRequest) -> HttpResponse:
    if request.method == "GET":  # the address bar shows this URL after a form sent back with errors
        return redirect("session_list")
    form = SessionStartForm(request.POST, agents=selectors.agents_to_start(user=request.user))
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


def _session_or_404(request: AuthedRequest, session_id: UUID) -> AgentSession:
    try:
        return selectors.session_get(session_id, user=request.user)
    except NotFound as exc:
        raise Http404("No such session") from exc


def _session_to_operate(request: AuthedRequest, session_id: UUID) -> AgentSession:
    try:
        return selectors.session_to_operate(session_id, user=request.user)
    except NotFound as exc:
        raise Http404("No such session") from exc
    except PermissionDenied as exc:
        raise DjangoPermissionDenied(exc.message) from exc


def _act(request: HtmxHttpRequest, session_id: UUID, action: Callable[[], object], *,
         success: str | Callable[[], str]) -> HttpResponse:
    """Run an operator's action on the session: its refusal (a DomainError) or ``success`` (text,
    or a callable that says what happened) as a flash message, then back to the session's page."""
    try:
        action()
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, success() if callable(success) else success)
    return _back_to_session(request, session_id)


def _timeline(session: AgentSession, *, before: int | None = None) -> tuple[list[presenters.TurnView], int | None]:
    """The last turns of the session (before turn index ``before``) with their steps, and the index
    to page back from (None when these are the first turns). Five queries whatever their size."""
    turns, more = selectors.timeline_turns(session.id, before=before, per_page=TURNS_PER_PAGE)
    steps = selectors.steps_of_turns(t.id for t in turns)
    cards = presenters.step_views(steps, approvals=approval_selectors.latest_approval_by_step(s.id for s in steps),
                                  streams=selectors.streamed_texts(session.id, [s.id for s in steps]),
                                  seq=session.last_seq)
    notes = selectors.notes_of_turns(session.id, [t.id for t in turns])
    return (presenters.turn_views(turns, cards, seq=session.last_seq, notes=notes),
            turns[0].index if more and turns else None)


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def session_detail_view(request: AuthedRequest, session_id: UUID) -> HttpResponse:
    # The session row (and its last_seq) is read before the timeline: replaying events after
    # last_seq can only bring the page forward, never skip something.
    session = _session_or_404(request, session_id)
    turns, earlier_before = _timeline(session)
    context = {"nav": "sessions", "turns": turns, "earlier_before": earlier_before,
               "artifacts": selectors.artifacts_of_session(session.id, newest_first=True, limit=ARTIFACTS_LIMIT),
               "grants": [{"grant": g, "live": approval_selectors.grant_is_live_now(g)}
                          for g in approval_selectors.grants_of_session(session.id, user=request.user)],
               "can_revoke": has_perm(request.user, DECIDE_APPROVALS)
               and has_team_role(request.user, session.team_id, REVIEW_ROLES),
               **presenters.sidebar_context(session, can_operate=has_perm(request.user, OPERATE_SESSIONS))}
    return render(request, "dashboard/session_detail.html", context)


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def session_timeline_view(request: AuthedRequest, session_id: UUID) -> HttpResponse:
    """Older turns, for the "load earlier turns" button."""
    session = _session_or_404(request, session_id)
    try:
        before: int | None = int(request.GET.get("before", ""))
    except ValueError:
        before = None
    if before is not None and not 0 <= before < 2**63:
        before = None  # a bigint comparison would overflow: as if absent
    turns, earlier_before = _timeline(session, before=before)
    return render(request, "dashboard/_timeline_page.html",
                  {"session": session, "turns": turns, "earlier_before": earlier_before})


def _back_to_session(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    # The sidebar's forms post with htmx when the page was updated live (the pushed copy has no
    # CSRF token in it: htmx sends the header): go to the page as a plain form post would.
    url = reverse("session_detail", kwargs={"session_id": session_id})
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@require_POST
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def turn_submit_view(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    _session_to_operate(request, session_id)
    try:
        turn_submit(session_id=session_id, input=request.POST.get("input", ""), actor=request.user)
    except DomainError as exc:
        messages.error(request, exc.message)
    return _back_to_session(request, session_id)


@require_POST
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def session_cancel_view(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    _session_to_operate(request, session_id)
    return _act(request, session_id, lambda: session_cancel(session_id=session_id, actor=request.user),
                success="The running turn was cancelled.")


@require_POST
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def turn_retry_view(request: HtmxHttpRequest, session_id: UUID, turn_id: UUID) -> HttpResponse:
    _session_to_operate(request, session_id)

    was_active = []

    def retry() -> None:
        turn = selectors.turn_get(turn_id, user=request.user)
        if turn.session_id != session_id:
            raise NotFound(f"No turn {turn_id} in this session")
        was_active.append(turn.is_active)
        turn_retry(turn_id=turn.id, actor=request.user)

    # A retry of a turn that is still at work is a replay (a second click): it said "The turn runs
    # again." of a turn waiting for its approval, and nothing happened (a tenancy audit).
    return _act(request, session_id, retry, success=lambda: "This turn is still at work: nothing to retry."
                if was_active and was_active[0] else "The turn runs again.")


@require_POST
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def session_compact_view(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    session = _session_to_operate(request, session_id)
    session_compact_request(session_id=session.id, actor=request.user)
    messages.success(request, "The history is compacted before the next model call.")
    return _back_to_session(request, session_id)


@require_POST
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def session_budget_view(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    _session_to_operate(request, session_id)
    form = BudgetRaiseForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Budgets are whole numbers, 0 or more.")
        return _back_to_session(request, session_id)
    return _act(request, session_id,
                lambda: session_budget_raise(session_id=session_id, actor=request.user, budget=form.budget()),
                success="Budget updated.")


@require_POST
@login_required
@permission_required(OPERATE_SESSIONS, raise_exception=True)
def session_pinned_view(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    session = _session_to_operate(request, session_id)
    form = SessionPinnedForm(request.POST)
    if not form.is_valid():
        messages.error(request, "The pinned context could not be read.")
        return _back_to_session(request, session_id)
    return _act(request, session_id,
                lambda: session_pinned_update(session_id=session.id, actor=request.user, pinned=form.pinned()),
                success="Pinned context saved: the next model call sends it.")


@require_GET
@login_required
@permission_required(VIEW_SESSIONS, raise_exception=True)
def artifact_download_view(request: AuthedRequest, session_id: UUID, artifact_id: UUID) -> HttpResponseBase:
    try:
        return artifact_response(selectors.artifact_file_get(artifact_id=artifact_id, session_id=session_id,
                                                                 user=request.user))
    except NotFound as exc:
        raise Http404(exc.message) from exc
