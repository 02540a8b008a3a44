"""Reads of the vault: secret metadata for the members of its team (never the value)."""

import uuid
from typing import Any

from django.db.models import QuerySet

from agentops.domain import NotFound
from agentops.teams import scope
from vault_app.models import Secret


def secrets_list(*, user: Any, team_id: int | None = None) -> "QuerySet[Secret]":
    qs = scope(Secret.objects.all(), user).defer("ciphertext").order_by("name", "pk")
    return qs if team_id is None else qs.filter(team_id=team_id)


def secret_get(secret_id: Any, *, user: Any) -> Secret:
    try:
        return scope(Secret.objects.defer("ciphertext"), user).get(pk=uuid.UUID(str(secret_id)))
    except (ValueError, Secret.DoesNotExist) as exc:
        raise NotFound(f"No secret {secret_id}") from exc


def secrets_named(*, team_id: int | None, names: list[str]) -> dict[str, Secret]:
    """The team's secrets of these names (metadata; for the reviewer's page), by name."""
    if team_id is None or not names:
        return {}
    return {s.name: s for s in Secret.objects.defer("ciphertext").filter(team_id=team_id, name__in=names)}
