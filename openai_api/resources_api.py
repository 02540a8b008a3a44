"""The wire's peripheral routes that map to what agentops has: subagents (child sessions), vaults
and credentials (the secrets vault), environments (sandbox hosts and customer runners).

``register(api)`` declares them on the wire's NinjaAPI from ``openai_api.api``, at the place the
route order needs (``/agents/environments`` before ``/agents/{agent_id}``). Same rules as there:
parse, check, call one service or selector, shape with ``openai_api.wire_resources``.
"""

from collections.abc import Callable
from typing import Any

from ninja import NinjaAPI

from agentops.domain import NotFound
from agentops.http import AuthedRequest
from agentops.models import Team
from agentops.permissions import VIEW_SESSIONS, require_perm
from fanout_app.selectors import children_by_step, subagent_descendants
from hosts_app import runners
from hosts_app import selectors as host_selectors
from openai_api import parse, parse_resources, wire
from openai_api import wire_resources as out
from openai_api.pages import empty_page, list_page, page
from sessions_app import selectors
from sessions_app.models import AgentSession
from vault_app import selectors as vault_selectors
from vault_app import services as vault_services
from vault_app.models import Secret


def _subagent(request: AuthedRequest, session_id: str, subagent_id: str) -> tuple[AgentSession, dict[str, Any]]:
    """The session (scoped) and its child ``subagent_id`` (nested ones included), else 404."""
    require_perm(request.user, VIEW_SESSIONS)
    session = selectors.session_get(session_id, user=request.user)
    found = subagent_descendants(session.id, child_id=subagent_id)
    if not found:
        raise NotFound(f"No subagent {subagent_id} in session {session.id}")
    return session, found[0]


def _child(request: AuthedRequest, subagent: dict[str, Any]) -> AgentSession:
    return selectors.session_get(subagent["session_id"], user=request.user)


def _turn(turn: Any, child: AgentSession, session: AgentSession) -> dict[str, Any]:
    """A subagent's turn: the child session's turn, owned on the wire by the session asked about."""
    return {**wire.turn_out(turn, child.agent.slug), "session_id": str(session.id), "subagent_id": str(child.id)}


def register_subagents(api: NinjaAPI, client_tools: Callable[[], frozenset[str]]) -> None:
    @api.get("/agents/sessions/{session_id}/subagents")
    def subagents_list_api(request: AuthedRequest, session_id: str, after: str | None = None, limit: int = 20,
                           order: str = "desc") -> dict[str, Any]:
        """Every child session spawned under this one (``spawn_subagents``), nested and closed ones too."""
        require_perm(request.user, VIEW_SESSIONS)
        session = selectors.session_get(session_id, user=request.user)
        limit, order = parse.list_params(limit, order)
        rows = [out.subagent_out(c, session_id=str(session.id)) for c in subagent_descendants(session.id)]
        return list_page(rows, after=after, order=order, limit=limit)

    @api.get("/agents/sessions/{session_id}/subagents/{subagent_id}")
    def subagent_retrieve_api(request: AuthedRequest, session_id: str, subagent_id: str) -> dict[str, Any]:
        session, subagent = _subagent(request, session_id, subagent_id)
        return out.subagent_out(subagent, session_id=str(session.id))

    @api.get("/agents/sessions/{session_id}/subagents/{subagent_id}/turns")
    def subagent_turns_api(request: AuthedRequest, session_id: str, subagent_id: str, after: str | None = None,
                           limit: int = 20, order: str = "desc") -> dict[str, Any]:
        session, subagent = _subagent(request, session_id, subagent_id)
        child = _child(request, subagent)
        limit, order = parse.list_params(limit, order)
        after_row = selectors.turn_of_session(session_id=child.id, turn_id=after) if after else None
        return page(selectors.turns_of_session_qs(child.id), after_row=after_row, order=order, limit=limit,
                    fields=("index", "id"), serialize=lambda t: _turn(t, child, session))

    @api.get("/agents/sessions/{session_id}/subagents/{subagent_id}/turns/{turn_id}")
    def subagent_turn_api(request: AuthedRequest, session_id: str, subagent_id: str, turn_id: str) -> dict[str, Any]:
        session, subagent = _subagent(request, session_id, subagent_id)
        child = _child(request, subagent)
        return _turn(selectors.turn_of_session(session_id=child.id, turn_id=turn_id), child, session)

    @api.get("/agents/sessions/{session_id}/subagents/{subagent_id}/turns/{turn_id}/items")
    def subagent_turn_items_api(request: AuthedRequest, session_id: str, subagent_id: str, turn_id: str,
                                after: str | None = None, limit: int = 20, order: str = "desc") -> dict[str, Any]:
        _session, subagent = _subagent(request, session_id, subagent_id)
        child = _child(request, subagent)
        limit, order = parse.list_params(limit, order)
        turn = selectors.turn_of_session(session_id=child.id, turn_id=turn_id)
        return list_page(wire.turn_items(turn, selectors.turn_steps(turn.id), client_tools(), agent_id=str(child.id),
                                         children=children_by_step(child.id)), after=after, order=order, limit=limit)

    @api.get("/agents/sessions/{session_id}/subagents/{subagent_id}/items")
    def subagent_items_api(request: AuthedRequest, session_id: str, subagent_id: str, after: str | None = None,
                           limit: int = 20, order: str = "desc") -> dict[str, Any]:
        _session, subagent = _subagent(request, session_id, subagent_id)
        child = _child(request, subagent)
        limit, order = parse.list_params(limit, order)
        turns = selectors.turns_of_session(child.id)
        steps = selectors.steps_of_turns([t.id for t in turns])
        tools, children = client_tools(), children_by_step(child.id)
        items: list[dict[str, Any]] = []
        for turn in turns:  # a subagent's own calls: its wire agent id is its subagent id
            items += wire.turn_items(turn, [s for s in steps if s.turn_id == turn.id], tools, agent_id=str(child.id),
                                     children=children)
        return list_page(items, after=after, order=order, limit=limit)


# --- vaults and credentials ----------------------------------------------------------------------

VAULT_IS_TEAM = ("a vault is one of your agentops teams (its secret namespace, id = the team's slug); teams are "
                 "created, renamed and deleted by an agentops admin")


def _credential(request: AuthedRequest, vault_id: str, credential_id: str) -> tuple[str, Secret]:
    team = vault_selectors.vault_team_get(vault_id, user=request.user)
    secret = vault_selectors.secret_get(credential_id, user=request.user)
    if secret.team_id != team.pk:
        raise NotFound(f"No credential {credential_id} in vault {vault_id}")
    return team.slug, secret


def register_vaults(api: NinjaAPI) -> None:
    @api.get("/vaults")
    def vaults_list_api(request: AuthedRequest, after: str | None = None, limit: int = 20, order: str = "desc",
                        status: str | None = None) -> dict[str, Any]:
        limit, order = parse.list_params(limit, order)
        if status not in (None, "active"):
            return empty_page()  # a team's vault is never archived
        rows = [out.vault_out(t) for t in vault_selectors.vault_teams(user=request.user)]
        return list_page(rows, after=after, order=order, limit=limit)

    @api.post("/vaults")
    def vault_create_api(request: AuthedRequest) -> dict[str, Any]:
        raise parse.WireError(f"agentops does not create vaults: {VAULT_IS_TEAM}.", code="unsupported_feature")

    @api.get("/vaults/{vault_id}")
    def vault_retrieve_api(request: AuthedRequest, vault_id: str) -> dict[str, Any]:
        return out.vault_out(vault_selectors.vault_team_get(vault_id, user=request.user))

    @api.post("/vaults/{vault_id}")
    def vault_update_api(request: AuthedRequest, vault_id: str) -> dict[str, Any]:
        vault_selectors.vault_team_get(vault_id, user=request.user)
        raise parse.WireError(f"agentops does not update vaults: {VAULT_IS_TEAM}.", code="unsupported_feature")

    @api.delete("/vaults/{vault_id}")
    def vault_delete_api(request: AuthedRequest, vault_id: str) -> dict[str, Any]:
        vault_selectors.vault_team_get(vault_id, user=request.user)
        raise parse.WireError(f"agentops does not delete vaults: {VAULT_IS_TEAM}; delete its credentials one by "
                              "one.", code="unsupported_feature")

    @api.get("/vaults/{vault_id}/credentials")
    def credentials_list_api(request: AuthedRequest, vault_id: str, after: str | None = None, limit: int = 20,
                             order: str = "desc", status: str | None = None) -> dict[str, Any]:
        team = vault_selectors.vault_team_get(vault_id, user=request.user)
        limit, order = parse.list_params(limit, order)
        if status not in (None, "active"):
            return empty_page()
        after_row = _credential(request, vault_id, after)[1] if after else None
        return page(vault_selectors.secrets_list(user=request.user, team_id=team.pk), after_row=after_row,
                    order=order, limit=limit, fields=("created_at", "id"),
                    serialize=lambda s: out.credential_out(s, team.slug))

    @api.post("/vaults/{vault_id}/credentials")
    def credential_create_api(request: AuthedRequest, vault_id: str) -> dict[str, Any]:
        """A secret of the team, of the wire's ``environment_variable`` kind; the value goes in, never out."""
        team = vault_selectors.vault_team_get(vault_id, user=request.user)
        spec = parse_resources.credential_create(parse.body(request))
        secret = vault_services.secret_create(actor=request.user, team_id=team.pk, name=spec.name, value=spec.value,
                                              allowed_tools=spec.allowed_tools or [],
                                              description=spec.description or "")
        return out.credential_out(vault_selectors.secret_get(secret.pk, user=request.user), team.slug)

    @api.get("/vaults/{vault_id}/credentials/{credential_id}")
    def credential_retrieve_api(request: AuthedRequest, vault_id: str, credential_id: str) -> dict[str, Any]:
        slug, secret = _credential(request, vault_id, credential_id)
        return out.credential_out(secret, slug)

    @api.post("/vaults/{vault_id}/credentials/{credential_id}")
    def credential_update_api(request: AuthedRequest, vault_id: str, credential_id: str) -> dict[str, Any]:
        slug, secret = _credential(request, vault_id, credential_id)
        spec = parse_resources.credential_update(parse.body(request))
        vault_services.secret_update(actor=request.user, secret_id=secret.pk, value=spec.value or None,
                                     allowed_tools=spec.allowed_tools, description=spec.description)
        return out.credential_out(vault_selectors.secret_get(secret.pk, user=request.user), slug)

    @api.delete("/vaults/{vault_id}/credentials/{credential_id}")
    def credential_delete_api(request: AuthedRequest, vault_id: str, credential_id: str) -> dict[str, Any]:
        _slug, secret = _credential(request, vault_id, credential_id)
        vault_services.secret_delete(actor=request.user, secret_id=secret.pk)
        return wire.deleted(str(secret.pk), "vault.credential")


# --- environments ------------------------------------------------------------------------------

def register_environments(api: NinjaAPI, refuse: Callable[[AuthedRequest, str], dict[str, Any]]) -> None:
    """``refuse(request, rest)``: the answer for environment templates (agentops has none)."""

    @api.get("/agents/environments")
    def environments_list_api(request: AuthedRequest, after: str | None = None, limit: int = 20,
                              order: str = "desc", type: str | None = None) -> dict[str, Any]:  # noqa: A002
        """The sandbox hosts the caller sees: the operator's hosted ones and their teams' runners."""
        limit, order = parse.list_params(limit, order)
        if type not in (None, "self_hosted"):
            return empty_page()  # none is openai_hosted
        after_row = host_selectors.host_visible_get(user=request.user, name=after) if after else None
        return page(host_selectors.hosts_visible(request.user), after_row=after_row, order=order, limit=limit,
                    fields=("created_at", "id"), serialize=out.environment_out)

    @api.post("/agents/environments")
    def environment_create_api(request: AuthedRequest) -> dict[str, Any]:
        """``self_hosted``: a customer runner of one of your teams (``hosts_app.runners``); its token is in
        this response only. Anything hosted is refused."""
        spec = parse_resources.environment_create(parse.body(request))
        # A named team the caller belongs to (runner_create checks the operator role: 403 otherwise),
        # else the one team where the caller operates.
        team = (vault_selectors.vault_team_get(spec.team, user=request.user) if spec.team
                else Team.objects.get(pk=selectors.team_for_new_agent(user=request.user)))
        host, token = runners.runner_create(team=team, name=spec.name,
                                            actor=request.user, pool=spec.pool, labels=spec.labels)
        return {**out.environment_out(host_selectors.host_visible_get(user=request.user, name=host.name)),
                "agentops_runner_token": token}

    @api.api_operation(["GET", "POST", "DELETE"], "/agents/environments/{path:rest}")
    def environment_api(request: AuthedRequest, rest: str) -> dict[str, Any]:
        parts = rest.strip("/").split("/")
        if parts[0] == "templates":
            return refuse(request, rest)
        host = host_selectors.host_visible_get(user=request.user, name=parts[0])
        if len(parts) == 1 and request.method == "GET":
            return out.environment_out(host)
        if parts[1:] == ["files"]:
            if request.method == "POST":
                raise parse.WireError("agentops does not copy files into a sandbox host through the wire: give the "
                                      "agent the files in its session's workspace.", code="unsupported_feature")
            if request.method == "GET":
                return {"object": "list", "data": [], "has_more": False, "next": None}
        raise NotFound(f"No such environment endpoint {request.method} /agents/environments/{rest.strip('/')}")
