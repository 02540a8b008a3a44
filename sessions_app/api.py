"""Sessions, turns, events, artifacts, agents and tools: the integration API."""

from functools import partial
from typing import Any

from django.conf import settings
from django.http import FileResponse, StreamingHttpResponse
from ninja import Query, Router
from ninja.responses import Status

from agentops import streamaccess
from agentops.api import ERRORS
from agentops.asyncdb import database_read
from agentops.domain import InvalidArguments, Throttled
from agentops.http import AuthedRequest
from agentops.pagination import get_paginated_response
from agentops.permissions import OPERATE_SESSIONS, VIEW_SESSIONS, VIEW_TOOLS, has_perm, require_perm
from sessions_app import selectors, services, streams
from sessions_app.downloads import artifact_response
from sessions_app.engine import commands as engine
from sessions_app.models import AgentSession, Turn
from sessions_app.schemas import (
    AgentOut,
    ArtifactOut,
    BudgetRaiseIn,
    EventPageOut,
    SessionCreatedOut,
    SessionCreateIn,
    SessionOut,
    SessionPageOut,
    SessionPinnedIn,
    StepOut,
    ToolOut,
    ToolOutputIn,
    TurnCreateIn,
    TurnDetailOut,
    TurnOut,
)
from sessions_app.services import session_compact_request, session_pinned_update
from tools_app.selectors import tool_definitions_visible

router = Router(tags=["sessions"])


def session_out(s: AgentSession) -> dict[str, Any]:
    return {
        "id": s.id, "agent": s.agent.slug, "owner": s.owner.get_username(), "title": s.title, "status": s.status,
        "pinned": {"requirements": s.requirements, "prohibitions": s.prohibitions,
                   "acceptance_criteria": s.acceptance_criteria},
        "pinned_revision": s.pinned_revision, "compact_requested": s.compact_requested,
        "criteria_unmet": s.criteria_unmet,
        "budget": {"max_tool_calls": s.max_tool_calls, "max_model_calls": s.max_model_calls,
                   "max_tokens": s.max_tokens, "max_wall_seconds": s.max_wall_seconds},
        "usage": {"tool_calls": s.tool_calls, "model_calls": s.model_calls, "prompt_tokens": s.prompt_tokens,
                  "completion_tokens": s.completion_tokens, "wall_seconds": s.wall_seconds},
        "metadata": s.metadata, "last_seq": s.last_seq, "created_at": s.created_at, "updated_at": s.updated_at,
    }


@router.post("/sessions", response={201: SessionCreatedOut, **ERRORS})
def session_start_api(request: AuthedRequest, payload: SessionCreateIn) -> Status[dict[str, Any]]:
    require_perm(request.user, OPERATE_SESSIONS)
    agent = selectors.agent_get(payload.agent, user=request.user)
    session, turn = engine.session_start(
        agent=agent, owner=request.user, input=payload.input or "", title=payload.title or "",
        pinned=payload.pinned, budget=payload.budget, metadata=payload.metadata,
        idempotency_key=request.headers.get("Idempotency-Key", ""))
    return Status(201, {**session_out(session), "turn": turn})  # the rows as written: no read back


@router.get("/sessions", response={200: SessionPageOut, **ERRORS})
def sessions_list_api(request: AuthedRequest, status: str | None = None, agent: str | None = None,
                      q: str | None = None, cursor: str | None = None, limit: int = 50,
                      batch: str | None = None) -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    if status and status not in AgentSession.Status.values:
        raise InvalidArguments(f"Unknown status {status!r}", details={"allowed": AgentSession.Status.values})
    return get_paginated_response(queryset=selectors.sessions_list(user=request.user, status=status, agent=agent, q=q,
                                                                          batch=batch),
                                  cursor=cursor, limit=limit, serialize=session_out)


@router.get("/sessions/{session_id}", response={200: SessionOut, **ERRORS})
def session_get_api(request: AuthedRequest, session_id: str) -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    return session_out(selectors.session_get(session_id, user=request.user))


@router.post("/sessions/{session_id}/cancel", response={200: SessionOut, **ERRORS})
def session_cancel_api(request: AuthedRequest, session_id: str) -> dict[str, Any]:
    require_perm(request.user, OPERATE_SESSIONS)
    session = selectors.session_to_operate(session_id, user=request.user)
    engine.session_cancel(session_id=session.id, actor=request.user)
    return session_out(selectors.session_get(session.id, user=request.user))


@router.post("/sessions/{session_id}/budget", response={200: SessionOut, **ERRORS})
def session_budget_raise_api(request: AuthedRequest, session_id: str, payload: BudgetRaiseIn) -> dict[str, Any]:
    """Raise (or lift, with null) the budgets named in the body; the others are kept."""
    require_perm(request.user, OPERATE_SESSIONS)
    session = selectors.session_to_operate(session_id, user=request.user)
    return session_out(services.session_budget_raise(session_id=session.id, actor=request.user,
                                                     budget=payload.model_dump(exclude_unset=True)))


@router.post("/turns/{turn_id}/retry", response={200: TurnOut, **ERRORS})
def turn_retry_api(request: AuthedRequest, turn_id: str) -> Turn:
    """Run a failed, retryable turn again from where it stopped."""
    require_perm(request.user, OPERATE_SESSIONS)
    turn = selectors.turn_get(turn_id, user=request.user)
    selectors.session_to_operate(turn.session_id, user=request.user)
    return engine.turn_retry(turn_id=turn.id, actor=request.user)


@router.post("/sessions/{session_id}/compact", response={202: SessionOut, **ERRORS})
def session_compact_api(request: AuthedRequest, session_id: str) -> Status[dict[str, Any]]:
    """Compact before the session's next model call (idempotent while one is pending)."""
    require_perm(request.user, OPERATE_SESSIONS)
    session = selectors.session_to_operate(session_id, user=request.user)
    session_compact_request(session_id=session.id, actor=request.user)
    return Status(202, session_out(selectors.session_get(session.id, user=request.user)))


@router.put("/sessions/{session_id}/pinned", response={200: SessionOut, **ERRORS})
def session_pinned_update_api(request: AuthedRequest, session_id: str, payload: SessionPinnedIn) -> dict[str, Any]:
    """Edit the pinned context mid-session: the next model call sends the new one, verbatim."""
    require_perm(request.user, OPERATE_SESSIONS)
    session = selectors.session_to_operate(session_id, user=request.user)
    session_pinned_update(session_id=session.id, actor=request.user, pinned=payload.dict(exclude_unset=True))
    return session_out(selectors.session_get(session.id, user=request.user))


@router.post("/sessions/{session_id}/turns", response={201: TurnOut, **ERRORS})
def turn_submit_api(request: AuthedRequest, session_id: str, payload: TurnCreateIn) -> Status[Turn]:
    require_perm(request.user, OPERATE_SESSIONS)
    session = selectors.session_to_operate(session_id, user=request.user)
    turn = engine.turn_submit(session_id=session.id, input=payload.input, actor=request.user,
                              idempotency_key=request.headers.get("Idempotency-Key", ""))
    return Status(201, turn)


@router.get("/sessions/{session_id}/turns", response={200: list[TurnOut], **ERRORS})
def turns_list_api(request: AuthedRequest, session_id: str) -> list[Turn]:
    require_perm(request.user, VIEW_SESSIONS)
    return selectors.turns_of_session(selectors.session_get(session_id, user=request.user).id)


@router.get("/turns/{turn_id}", response={200: TurnDetailOut, **ERRORS})
def turn_get_api(request: AuthedRequest, turn_id: str) -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    turn = selectors.turn_get(turn_id, user=request.user)
    data = TurnOut.model_validate(turn).model_dump()
    data["steps"] = [StepOut.model_validate(s).model_dump() for s in selectors.turn_steps(turn.id)]
    return data


@router.get("/sessions/{session_id}/events", response={200: EventPageOut, **ERRORS})
def events_list_api(request: AuthedRequest, session_id: str, after: int = Query(0, ge=0, lt=2**63),
                    limit: int = 200) -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    limit = max(1, min(limit, 1000))
    items = selectors.events_after(session_id=session.id, after=max(0, after), limit=limit)
    return {"items": items, "next_after": items[-1].seq if items else max(0, after)}


@router.get("/sessions/{session_id}/events/stream", response={200: None, **ERRORS})
def events_stream_api(request: AuthedRequest, session_id: str, after: int | None = Query(None, ge=0, lt=2**63),
                      max_seconds: float | None = Query(None, gt=0, le=24 * 3600, allow_inf_nan=False,
                                                        description="Close after this long (tests).")
                      ) -> StreamingHttpResponse:
    """Server-Sent Events: the backlog after ``after`` (else ``Last-Event-ID``, else 0), then live
    events, each once and in seq order (``sessions_app/streams.py``)."""
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    if not streamaccess.replays.allow(request.user.pk):
        raise Throttled("Too many stream (re)connections; wait a minute.",
                        details={"per_minute": settings.AGENTOPS_STREAM_REPLAYS_PER_MINUTE})
    last_event_id = request.headers.get("Last-Event-ID", "")
    start = after if after is not None else int(last_event_id) \
        if last_event_id.isascii() and last_event_id.isdigit() and len(last_event_id) < 19 else 0
    credential = streamaccess.credential_of_request(request)

    def may_watch(user: Any) -> bool:
        return has_perm(user, VIEW_SESSIONS) and selectors.session_exists(session.id, user=user)

    recheck = database_read(partial(streamaccess.still_allowed, credential, may_watch))
    response = StreamingHttpResponse(
        streams.event_stream(session.id, start, max_seconds=max_seconds, recheck=recheck,
                             recheck_seconds=settings.AGENTOPS_STREAM_RECHECK_SECONDS,
                             max_life_seconds=settings.AGENTOPS_STREAM_MAX_SECONDS),
        content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


@router.post("/sessions/{session_id}/tool-outputs", response={200: StepOut, **ERRORS})
def tool_output_submit_api(request: AuthedRequest, session_id: str, payload: ToolOutputIn) -> Any:
    require_perm(request.user, OPERATE_SESSIONS)
    session = selectors.session_to_operate(session_id, user=request.user)
    return engine.tool_output_submit(session_id=session.id, call_id=payload.call_id, output=payload.output,
                                     success=payload.success)


@router.get("/sessions/{session_id}/artifacts", response={200: list[ArtifactOut], **ERRORS})
def artifacts_list_api(request: AuthedRequest, session_id: str) -> Any:
    require_perm(request.user, VIEW_SESSIONS)
    return selectors.artifacts_of_session(selectors.session_get(session_id, user=request.user).id)


@router.get("/artifacts/{artifact_id}/content", response={200: None, **ERRORS})
def artifact_content_api(request: AuthedRequest, artifact_id: str) -> FileResponse:
    require_perm(request.user, VIEW_SESSIONS)
    return artifact_response(selectors.artifact_file_get(artifact_id=artifact_id, user=request.user))


@router.get("/agents", response={200: list[AgentOut], **ERRORS})
def agents_list_api(request: AuthedRequest) -> list[dict[str, Any]]:
    require_perm(request.user, VIEW_SESSIONS)
    return [{"slug": a.slug, "name": a.name, "model": a.model, "tools": [t.name for t in a.tools.all()],
             "budget": {"max_tool_calls": a.max_tool_calls, "max_model_calls": a.max_model_calls,
                        "max_tokens": a.max_tokens, "max_wall_seconds": a.max_wall_seconds}}
            for a in selectors.agents_enabled(user=request.user)]


@router.get("/tools", response={200: list[ToolOut], **ERRORS})
def tools_list_api(request: AuthedRequest) -> Any:
    require_perm(request.user, VIEW_TOOLS)
    return list(tool_definitions_visible(user=request.user))
