"""Reads of the vault: secret metadata for the members of its team (never the value)."""

import uuid
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from agentops.domain import NotFound
from agentops.models import Team
from agentops.teams import scope
from tools_app.secret_refs import references_in
from vault_app.models import Secret


def secrets_list(*, user: Any, team_id: int | None = None) -> "QuerySet[Secret]":
    qs = scope(Secret.objects.all(), user).defer("ciphertext").order_by("name", "pk")
    return qs if team_id is None else qs.filter(team_id=team_id)


def secret_get(secret_id: Any, *, user: Any) -> Secret:
    try:
        return scope(Secret.objects.defer("ciphertext"), user).get(pk=uuid.UUID(str(secret_id)))
    except (ValueError, Secret.DoesNotExist) as exc:
        raise NotFound(f"No secret {secret_id}") from exc


def secrets_for_call(*, team_id: int | None, tool_name: str, arguments: Any, env: Any) -> list[dict[str, Any]]:
    """What the reviewer's page shows: each secret the call references, where, and whether it
    will resolve (exists in the team, not expired, allowed for this tool). Never the value."""
    from vault_app.resolve import tool_allowed

    where: dict[str, list[str]] = {}
    for label, values in (("arguments", arguments), ("command environment", env)):
        for name in references_in(values):
            where.setdefault(name, []).append(label)
    found = secrets_named(team_id=team_id, names=sorted(where))
    now = timezone.now()
    rows = []
    for name in sorted(where):
        secret = found.get(name)
        if secret is None:
            note, ok = "unknown in this team's vault: the call will be refused", False
        elif secret.expires_at is not None and secret.expires_at <= now:
            note, ok = f"expired {secret.expires_at:%Y-%m-%d %H:%M} UTC: the call will be refused", False
        elif not tool_allowed(secret, tool_name):
            note, ok = f"not allowed for {tool_name}: the call will be refused", False
        else:
            note = "resolved at run time" + (f", expires {secret.expires_at:%Y-%m-%d %H:%M} UTC"
                                             if secret.expires_at else "")
            ok = True
        rows.append({"name": name, "where": " and ".join(where[name]), "note": note, "ok": ok})
    return rows


def secrets_named(*, team_id: int | None, names: list[str]) -> dict[str, Secret]:
    """The team's secrets of these names (metadata; for the reviewer's page), by name."""
    if team_id is None or not names:
        return {}
    return {s.name: s for s in Secret.objects.defer("ciphertext").filter(team_id=team_id, name__in=names)}


def vault_teams(*, user: Any) -> "QuerySet[Team]":
    """The teams whose secrets the user sees (a team's secrets are its vault), by creation."""
    return scope(Team.objects.all(), user, field="id").order_by("created_at", "id")


def vault_team_get(slug: str, *, user: Any) -> Team:
    team = vault_teams(user=user).filter(slug=slug).first()
    if team is None:
        raise NotFound(f"No vault {slug!r}: a vault is one of your teams (its slug)")
    return team
