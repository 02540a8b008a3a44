"""The vault's JSON API: secret metadata for the team's members; writes for holders of the
vault_app permissions. No endpoint returns a value."""

from typing import Any

from django.utils import timezone
from ninja import Router
from ninja.responses import Status

from agentops.api import ERRORS
from agentops.domain import NotFound
from agentops.http import AuthedRequest
from agentops.models import Team
from agentops.pagination import get_paginated_response
from agentops.teams import scope
from vault_app import selectors, services
from vault_app.models import Secret
from vault_app.schemas import SecretCreateIn, SecretOut, SecretPageOut, SecretUpdateIn

router = Router(tags=["secrets"])


def secret_out(s: Secret) -> dict[str, Any]:
    return {"id": s.id, "team": s.team.slug, "name": s.name, "description": s.description,
            "allowed_tools": s.allowed_tools, "expires_at": s.expires_at,
            "expired": s.expires_at is not None and s.expires_at <= timezone.now(),
            "value_updated_at": s.value_updated_at,
            "created_by": s.created_by.get_username() if s.created_by else None,
            "created_at": s.created_at, "updated_at": s.updated_at}


def _team_id(slug: str, user: Any) -> int:
    """A team of the user's by slug: another team's is as unknown as one that does not exist."""
    team_id = scope(Team.objects.filter(slug=slug), user, field="id").values_list("pk", flat=True).first()
    if team_id is None:
        raise NotFound(f"No team {slug!r}")
    return team_id


@router.get("/secrets", response={200: SecretPageOut, **ERRORS})
def secrets_list_api(request: AuthedRequest, team: str | None = None, cursor: str | None = None,
                     limit: int = 50) -> dict[str, Any]:
    qs = selectors.secrets_list(user=request.user, team_id=_team_id(team, request.user) if team else None)
    return get_paginated_response(queryset=qs.select_related("team", "created_by"), cursor=cursor, limit=limit,
                                  serialize=secret_out)


@router.post("/secrets", response={201: SecretOut, **ERRORS})
def secret_create_api(request: AuthedRequest, payload: SecretCreateIn) -> Status[dict[str, Any]]:
    secret = services.secret_create(actor=request.user, team_id=_team_id(payload.team, request.user), name=payload.name,
                                    value=payload.value, allowed_tools=payload.allowed_tools,
                                    description=payload.description, expires_at=payload.expires_at)
    return Status(201, secret_out(selectors.secret_get(secret.pk, user=request.user)))


@router.get("/secrets/{secret_id}", response={200: SecretOut, **ERRORS})
def secret_get_api(request: AuthedRequest, secret_id: str) -> dict[str, Any]:
    return secret_out(selectors.secret_get(secret_id, user=request.user))


@router.patch("/secrets/{secret_id}", response={200: SecretOut, **ERRORS})
def secret_update_api(request: AuthedRequest, secret_id: str, payload: SecretUpdateIn) -> dict[str, Any]:
    secret = selectors.secret_get(secret_id, user=request.user)
    services.secret_update(actor=request.user, secret_id=secret.pk, value=payload.value,
                           allowed_tools=payload.allowed_tools, description=payload.description,
                           expires_at=payload.expires_at, clear_expiry=payload.clear_expiry)
    return secret_out(selectors.secret_get(secret.pk, user=request.user))


@router.delete("/secrets/{secret_id}", response={204: None, **ERRORS})
def secret_delete_api(request: AuthedRequest, secret_id: str) -> Status[None]:
    secret = selectors.secret_get(secret_id, user=request.user)
    services.secret_delete(actor=request.user, secret_id=secret.pk)
    return Status(204, None)
