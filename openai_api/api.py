"""The OpenAI Agents API wire protocol at /openai/v1: ``OpenAI(base_url=…/openai/v1).beta.agents``.

An interface like ``sessions_app.api``: each endpoint parses the wire request (``openai_api.parse``),
checks the permission, calls agentops's services and selectors, and shapes the answer with
``openai_api.wire``. Errors leave in the wire's envelope ``{"error": {message, type, code,
param}}``; a 409 carries ``x-should-retry: false`` (the SDK retries 409 otherwise).

One module for the wire's routes (~500 lines), on purpose: django-ninja matches them in the order
they are declared (``/agents/sessions`` before ``/agents/{agent_id}``), which one file keeps
visible; the mapping and parsing live in ``wire`` and ``parse``.
"""

import logging
from functools import partial
from typing import Any

from django.conf import settings
from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError, transaction
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from agentops import errors, streamaccess
from agentops.asyncdb import database_read
from agentops.auth import BearerTokenAuth
from agentops.domain import Conflict, DomainError, InvalidArguments, NotFound
from agentops.http import AuthedRequest
from agentops.permissions import OPERATE_SESSIONS, VIEW_SESSIONS, has_perm, require_perm
from approvals_app import selectors as approval_selectors
from approvals_app.services import approval_decide
from fanout_app.selectors import children_by_step
from openai_api import parse, resources_api, wire
from openai_api import services as wire_services
from openai_api.pages import empty_page as _empty_page
from openai_api.pages import list_page as _list_page
from openai_api.pages import page as _page
from openai_api.streams import wire_event_stream
from sessions_app import agent_profiles, selectors, services
from sessions_app.downloads import artifact_response
from sessions_app.engine import commands as engine
from sessions_app.models import AgentSession, Artifact
from sessions_app.services import TurnActive
from tools_app.models import ToolDefinition
from tools_app.selectors import tool_definitions_by_name

log = logging.getLogger(__name__)

ADD_AGENTS = "sessions_app.add_agentprofile"
CHANGE_AGENTS = "sessions_app.change_agentprofile"
DELETE_AGENTS = "sessions_app.delete_agentprofile"

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
               422: "invalid_request_error", 429: "rate_limit_error"}


def error_body(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "code": code,
                      "param": param}}


def error_response(status: int, code: str, message: str, param: str | None = None) -> JsonResponse:
    response = JsonResponse(error_body(status, code, message, param), status=status)
    if status == 409:
        response["x-should-retry"] = "false"  # a conflict stays one on retry
    if status == 429:
        response["retry-after"] = "5"
    return response


api = NinjaAPI(title="agentops: OpenAI Agents API", version="v1", auth=[BearerTokenAuth()],
               urls_namespace="openai", docs_url=None)


@api.exception_handler(parse.WireError)
def on_wire_error(request: HttpRequest, exc: parse.WireError) -> HttpResponse:
    return error_response(exc.status, exc.code, exc.message, exc.param)


@api.exception_handler(DomainError)
def on_domain_error(request: HttpRequest, exc: DomainError) -> HttpResponse:
    param = exc.details.get("field") if isinstance(exc.details.get("field"), str) else None
    # The wire's invalid parameters are 400s (the SDK's BadRequestError); its 422 is a reused
    # Idempotency-Key only. agentops's own API answers these 422.
    status = 400 if exc.status == 422 and exc.code != "idempotency_key_reused" else exc.status
    return error_response(status, exc.code, exc.message, param)


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    first = exc.errors[0] if exc.errors else {}
    loc = first.get("loc") or []
    return error_response(400, "invalid_value", f"Invalid parameter: {first.get('msg', 'invalid')}",
                          str(loc[-1]) if loc else None)


@api.exception_handler(AuthenticationError)
def on_auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error_response(401, "invalid_api_key", "Incorrect or missing API key: send an agentops API token "
                                                  "as the Bearer token.")


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return error_response(exc.status_code, "invalid_request_error", str(exc.message))


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def on_database_unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
    return errors.database_unavailable_response(request, exc)


@api.exception_handler(Exception)
def on_unexpected_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    log.exception("unhandled error in %s %s", request.method, request.path)
    got_request_exception.send(sender=None, request=request)
    return error_response(500, "internal_error", "The server failed to handle this request.")


# --- agents -----------------------------------------------------------------------------------

def _functions(specs: list[parse.FunctionSpec]) -> list[dict[str, Any]]:
    return [{"name": s.name, "description": s.description, "parameters": s.parameters} for s in specs]


# Routes under /agents/sessions are declared before /agents/{agent_id}: the first match wins.

# --- sessions ---------------------------------------------------------------------------------

def _session_snapshot(session: AgentSession) -> dict[str, Any]:
    actions = wire.required_actions(selectors.client_steps_waiting(session.id),
                                    approval_selectors.approvals_pending_of_session(session.id))
    failed = selectors.turn_last_failed(session.id) if session.status == AgentSession.Status.FAILED else None
    return wire.session_out(session, actions=actions,
                            error=(failed.error_message or failed.error_code) if failed else None)


def _wire_stream(request: AuthedRequest, session_id: Any, after: int, stream: wire.WireStream) -> Any:
    """The session's wire events, re-checking every AGENTOPS_STREAM_RECHECK_SECONDS that the
    caller may still watch (``agentops/streamaccess.py``, as the other streams do)."""
    credential = streamaccess.credential_of_request(request)

    def may_watch(user: Any) -> bool:
        return has_perm(user, VIEW_SESSIONS) and selectors.session_exists(session_id, user=user)

    recheck = database_read(partial(streamaccess.still_allowed, credential, may_watch))
    return wire_event_stream(session_id, after, stream, recheck=recheck,
                             recheck_seconds=settings.AGENTOPS_STREAM_RECHECK_SECONDS)


def _sse(stream: Any) -> StreamingHttpResponse:
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


@api.post("/agents/sessions")
def session_create_api(request: AuthedRequest) -> Any:
    require_perm(request.user, OPERATE_SESSIONS)
    spec = parse.session_create(parse.body(request))
    key = request.headers.get("Idempotency-Key", "")
    started = selectors.session_started_with_key(user=request.user, key=key) if spec.stream and key else None
    if started is not None:
        # A streamed answer is not remembered by the Idempotency-Key middleware: the SDK's retry of
        # a create whose stream broke made a second session. The first one streams again, from 0.
        if started.turns.get(index=1).input != spec.input:
            raise InvalidArguments("This Idempotency-Key started a session with another input.",
                                   code="idempotency_key_reused")
        stream = wire.WireStream(snapshot=wire.session_out(selectors.session_get(started.id, user=request.user)))
        return _sse(_wire_stream(request, started.id, 0, stream))
    with transaction.atomic():  # an inline agent and the session it was made for: both, or neither
        session = _session_create(request, spec)
    if not spec.stream:
        return _session_snapshot(selectors.session_get(session.id, user=request.user))
    stream = wire.WireStream(snapshot=wire.session_out(selectors.session_get(session.id, user=request.user)))
    return _sse(_wire_stream(request, session.id, 0, stream))


def _session_create(request: AuthedRequest, spec: parse.SessionSpec) -> AgentSession:
    if spec.agent_id is not None:
        agent = selectors.agent_get_enabled(spec.agent_id, user=request.user)
        selectors.agent_get(agent.slug, user=request.user)  # a team where the user operates
    else:
        assert spec.agent is not None
        require_perm(request.user, ADD_AGENTS)
        team_id = selectors.team_for_new_agent(user=request.user, team=(spec.metadata or {}).get("agentops_team"))
        agent = agent_profiles.agent_profile_create(team_id=team_id, name=spec.agent.name or "session agent",
                                              model=spec.agent.model,
                                              instructions=spec.agent.instructions,
                                              functions=_functions(spec.agent.tools))
    session, _turn = wire_services.session_start_in(environment=spec.environment, agent=agent, owner=request.user,
                                                    input=spec.input, metadata=spec.metadata,
                                                    idempotency_key=request.headers.get("Idempotency-Key", ""))
    return session


@api.get("/agents/sessions")
def sessions_list_api(request: AuthedRequest, after: str | None = None, agent_id: str | None = None,
                      limit: int = 20, order: str = "desc") -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    limit, order = parse.list_params(limit, order)
    metadata = parse.deep_object(request, "metadata")
    qs = (selectors.sessions_list(user=request.user, agent=agent_id, metadata=metadata)
          .select_related("placement__host").prefetch_related("agent__tools"))
    after_row = selectors.session_get(after, user=request.user) if after else None
    return _page(qs, after_row=after_row, order=order, limit=limit, fields=("created_at", "id"),
                 serialize_rows=_session_snapshots)


def _session_snapshots(sessions: list[AgentSession]) -> list[dict[str, Any]]:
    """Sessions as the wire shows them, their required actions read for the whole page at once."""
    waiting = [s.id for s in sessions if wire.SESSION_STATUS[AgentSession.Status(s.status)] == "requires_action"]
    steps = selectors.client_steps_waiting_of(waiting)
    approvals = approval_selectors.approvals_pending_of_sessions(waiting)
    return [wire.session_out(s, actions=wire.required_actions([x for x in steps if x.session_id == s.id],
                                                             [a for a in approvals if a.session_id == s.id]))
            for s in sessions]


@api.get("/agents/sessions/{session_id}")
def session_retrieve_api(request: AuthedRequest, session_id: str) -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    return _session_snapshot(selectors.session_get(session_id, user=request.user))


@api.post("/agents/sessions/{session_id}")
def session_update_api(request: AuthedRequest, session_id: str) -> dict[str, Any]:
    require_perm(request.user, OPERATE_SESSIONS)
    session = selectors.session_to_operate(session_id, user=request.user)
    metadata = parse.session_update(parse.body(request))
    if metadata is not None:
        wire_services.session_metadata_set(session_id=str(session.id), metadata=metadata)
    return _session_snapshot(selectors.session_get(session.id, user=request.user))


@api.delete("/agents/sessions/{session_id}")
def session_delete_api(request: AuthedRequest, session_id: str) -> dict[str, Any]:
    require_perm(request.user, OPERATE_SESSIONS)
    session = selectors.session_to_operate(session_id, user=request.user)
    services.session_delete(session_id=session.id)
    return wire.deleted(str(session.id), "agent.session")


@api.get("/agents/sessions/{session_id}/events")
def session_events_stream_api(request: AuthedRequest, session_id: str, after: int | None = None,
                              include_obfuscation: bool = True) -> StreamingHttpResponse:
    """Live events (``after``, an agentops event seq, replays from there: an extension of the wire).

    The starting point and the state are read here, before the response's headers leave: the SDK
    posts its input once it has them, and that input's events must come after the start.
    """
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    start = session.last_seq if after is None else max(0, after)
    waiting = selectors.client_steps_waiting(session.id)
    snapshot = _session_snapshot(session)
    active = [t for t in selectors.turns_of_session(session.id) if t.is_active]
    announced, arguments = selectors.stream_seen(session.id, start) if start else (set(), {})
    stream = wire.WireStream(snapshot=snapshot, actions=snapshot["required_actions"], turns=active,
                             client_steps={str(s.id): s.call_id for s in waiting},
                             seen=wire.StreamSeen(frozenset(announced), arguments))
    return _sse(_wire_stream(request, session.id, start, stream))


@api.post("/agents/sessions/{session_id}/events")
def session_events_create_api(request: AuthedRequest, session_id: str) -> HttpResponse:
    """Input, tool results and cancel need the operator's permission; an approval answer needs
    what the queue needs (``approval_decide``: a reviewer, not the session's owner under four-eyes)."""
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    events = parse.session_inputs(parse.body(request))
    # All or nothing: an event refused after others applied (an unknown tool call after a message)
    # left the message's turn running, and the SDK's retry of that 400 sent the message again.
    with transaction.atomic():
        for event in events:
            _apply_input(request, session, event)
    return HttpResponse(status=202)


def _apply_input(request: AuthedRequest, session: AgentSession, event: parse.Input) -> None:
    if event.kind != "approval":
        require_perm(request.user, OPERATE_SESSIONS)
        selectors.session_to_operate(session.id, user=request.user)
    if event.kind == "message":
        try:
            engine.turn_submit(session_id=session.id, input=event.text, actor=request.user,
                               idempotency_key=request.headers.get("Idempotency-Key", ""))
        except TurnActive as exc:
            raise Conflict("The session has an active turn; it cannot accept more input until it ends "
                           "(cancel it, or wait for agent.session.idle).", code="active_turn_not_steerable") from exc
    elif event.kind == "tool_result":
        unknown = parse.WireError(f"Unknown pending tool call: {event.call_id}", code="invalid_request_error",
                                  param="call_id")
        try:
            engine.tool_output_submit(session_id=session.id, call_id=event.call_id, output=event.output,
                                      success=event.success, turn_id=event.turn_id)
        except NotFound as exc:
            raise unknown from exc
        except Conflict as exc:
            if exc.code == "not_waiting":
                raise unknown from exc
            raise
    elif event.kind == "cancel":
        engine.session_cancel(session_id=session.id, actor=request.user)
    elif event.kind == "approval":
        approval = approval_selectors.approval_get(event.request_id, user=request.user)
        if approval.session_id != session.id:
            raise NotFound(f"No approval request {event.request_id} in this session")
        if event.decision == "cancel":
            return  # "dismisses this request": it stays pending for the reviewers' queue
        approval_decide(request_id=approval.request_id, actor=request.user,
                        decision="approve" if event.decision == "approve" else "reject",
                        reason=event.reason, seen_hash=event.seen_hash)


@api.get("/agents/sessions/{session_id}/turns")
def turns_list_api(request: AuthedRequest, session_id: str, after: str | None = None, limit: int = 20,
                   order: str = "desc") -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    limit, order = parse.list_params(limit, order)
    after_row = selectors.turn_of_session(session_id=session.id, turn_id=after) if after else None
    return _page(selectors.turns_of_session_qs(session.id), after_row=after_row, order=order, limit=limit,
                 fields=("index", "id"), serialize=lambda t: wire.turn_out(t, session.agent.slug))


@api.get("/agents/sessions/{session_id}/turns/{turn_id}")
def turn_retrieve_api(request: AuthedRequest, session_id: str, turn_id: str) -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    return wire.turn_out(selectors.turn_of_session(session_id=session.id, turn_id=turn_id), session.agent.slug)


def _client_tools() -> frozenset[str]:
    return frozenset(name for name, t in tool_definitions_by_name().items() if t.kind == ToolDefinition.Kind.CLIENT)


@api.get("/agents/sessions/{session_id}/turns/{turn_id}/items")
def turn_items_list_api(request: AuthedRequest, session_id: str, turn_id: str, after: str | None = None,
                        limit: int = 20, order: str = "desc") -> dict[str, Any]:
    """A ConversationCursorPage: the SDK asks for the next page ``after`` the ``last_id``. Newest
    first unless ``order=asc`` (the wire's default)."""
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    limit, order = parse.list_params(limit, order)
    turn = selectors.turn_of_session(session_id=session.id, turn_id=turn_id)
    items = wire.turn_items(turn, selectors.turn_steps(turn.id), _client_tools(), agent_id=session.agent.slug,
                            children=children_by_step(session.id))
    return _list_page(items, after=after, order=order, limit=limit)


@api.get("/agents/sessions/{session_id}/items")
def session_items_list_api(request: AuthedRequest, session_id: str, after: str | None = None, limit: int = 20,
                           order: str = "desc") -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    limit, order = parse.list_params(limit, order)
    turns = selectors.turns_of_session(session.id)
    steps = selectors.steps_of_turns([t.id for t in turns])
    client_tools, children = _client_tools(), children_by_step(session.id)
    items: list[dict[str, Any]] = []
    for turn in turns:
        items += wire.turn_items(turn, [s for s in steps if s.turn_id == turn.id], client_tools,
                                 agent_id=session.agent.slug, children=children)
    return _list_page(items, after=after, order=order, limit=limit)


# --- artifacts --------------------------------------------------------------------------------

@api.get("/agents/sessions/{session_id}/artifacts")
def artifacts_list_api(request: AuthedRequest, session_id: str, after: str | None = None,
                       environment_id: str | None = None, limit: int = 20, order: str = "desc") -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    limit, order = parse.list_params(limit, order)
    where = wire.environment_out(session).get("id")  # a session's files are all in its one workspace
    if environment_id and environment_id != where:
        return _empty_page()
    after_row = selectors.artifact_of_session(session_id=session.id, artifact_id=after) if after else None
    return _page(selectors.artifacts_of_session_qs(session.id), after_row=after_row, order=order, limit=limit,
                 fields=("created_at", "id"), serialize=lambda a: wire.artifact_out(a, where))


@api.get("/agents/sessions/{session_id}/artifacts/{artifact_id}")
def artifact_retrieve_api(request: AuthedRequest, session_id: str, artifact_id: str) -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    return wire.artifact_out(selectors.artifact_of_session(session_id=session.id, artifact_id=artifact_id),
                             wire.environment_out(session).get("id"))


@api.delete("/agents/sessions/{session_id}/artifacts/{artifact_id}")
def artifact_delete_api(request: AuthedRequest, session_id: str, artifact_id: str) -> dict[str, Any]:
    require_perm(request.user, OPERATE_SESSIONS)
    session = selectors.session_to_operate(session_id, user=request.user)
    artifact: Artifact = selectors.artifact_of_session(session_id=session.id, artifact_id=artifact_id)
    services.artifact_delete(artifact_id=artifact.id, session_id=session.id)
    return wire.deleted(str(artifact.id), "agent.session.artifact")


@api.get("/agents/sessions/{session_id}/artifacts/{artifact_id}/content")
def artifact_content_api(request: AuthedRequest, session_id: str, artifact_id: str) -> FileResponse:
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    return artifact_response(selectors.artifact_file_get(artifact_id=artifact_id, session_id=session.id,
                                                         user=request.user))


# --- subagents (child sessions) and traces (agentops has none) ---------------------------------

resources_api.register_subagents(api, lambda: _client_tools())


@api.get("/agents/sessions/{session_id}/traces")
def traces_list_api(request: AuthedRequest, session_id: str) -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    selectors.session_get(session_id, user=request.user)
    raise parse.WireError("agentops does not export OTLP traces; read the session's events through "
                          "/api/sessions/{id}/events instead.", code="unsupported_endpoint", status=404)


# --- environments and vaults (openai_api.resources_api); templates and automations refused ---------

REFUSALS = {
    "environments": ("environment templates", "agentops has no hosted environments to build from templates; "
                                              "create a self_hosted environment (an agentops runner)."),
    "automations": ("automations", "agentops has no scheduled automations; start sessions from your own scheduler."),
}


def _peripheral(request: AuthedRequest, family: str, rest: str) -> dict[str, Any]:
    """What agentops lacks: creating one is refused (400 ``unsupported_feature``, never accepted
    and ignored); listing finds none; anything under an id is 404 (none can exist)."""
    require_perm(request.user, VIEW_SESSIONS)
    what, why = REFUSALS[family]
    collection = rest.strip("/") in ("", "templates")
    if collection and request.method == "POST":
        raise parse.WireError(f"agentops does not support {what}: {why}", code="unsupported_feature")
    if collection and request.method == "GET":
        return _empty_page()
    raise NotFound(f"No such {family.rstrip('s')} resource {rest.strip('/')!r}: agentops has no {what}.")


resources_api.register_environments(api, lambda request, rest: _peripheral(request, "environments", rest))
resources_api.register_vaults(api)


@api.api_operation(["GET", "POST"], "/agents/automations")
def automations_api(request: AuthedRequest) -> dict[str, Any]:
    return _peripheral(request, "automations", "")


@api.api_operation(["GET", "POST", "DELETE"], "/agents/automations/{path:rest}")
def automation_api(request: AuthedRequest, rest: str) -> dict[str, Any]:
    return _peripheral(request, "automations", rest)


# --- agents (after the fixed /agents/... paths) ------------------------------------------------

@api.post("/agents")
def agent_create_api(request: AuthedRequest) -> dict[str, Any]:
    require_perm(request.user, ADD_AGENTS)
    spec = parse.agent_create(parse.body(request))
    team_id = selectors.team_for_new_agent(user=request.user, team=(spec.metadata or {}).get("agentops_team"))
    agent = agent_profiles.agent_profile_create(team_id=team_id, name=spec.name or "agent", model=spec.model,
                                          instructions=spec.instructions, metadata=spec.metadata,
                                          functions=_functions(spec.tools))
    return wire.agent_out(selectors.agent_get_enabled(agent.slug, user=request.user))


@api.get("/agents")
def agents_list_api(request: AuthedRequest, after: str | None = None, limit: int = 20,
                    order: str = "desc") -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    limit, order = parse.list_params(limit, order)
    after_row = selectors.agent_get_enabled(after, user=request.user) if after else None
    return _page(selectors.agents_enabled(user=request.user), after_row=after_row,
                 order=order, limit=limit, fields=("created_at", "id"), serialize=wire.agent_out)


@api.get("/agents/{agent_id}")
def agent_retrieve_api(request: AuthedRequest, agent_id: str) -> dict[str, Any]:
    require_perm(request.user, VIEW_SESSIONS)
    return wire.agent_out(selectors.agent_get_enabled(agent_id, user=request.user))


@api.post("/agents/{agent_id}")
def agent_update_api(request: AuthedRequest, agent_id: str) -> dict[str, Any]:
    require_perm(request.user, CHANGE_AGENTS)
    agent = selectors.agent_get_enabled(agent_id, user=request.user)
    spec = parse.agent_update(parse.body(request))
    agent_profiles.agent_profile_update(agent_id=agent.pk, functions=_functions(spec.tools) if spec.tools is not None
                                  else None, **spec.fields)
    return wire.agent_out(selectors.agent_get_enabled(agent.slug, user=request.user))


@api.delete("/agents/{agent_id}")
def agent_delete_api(request: AuthedRequest, agent_id: str) -> dict[str, Any]:
    require_perm(request.user, DELETE_AGENTS)
    agent = selectors.agent_get_enabled(agent_id, user=request.user)
    agent_profiles.agent_profile_retire(agent_id=agent.pk)
    return wire.deleted(agent.slug, "agent")
