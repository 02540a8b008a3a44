"""Every write to the vault: create, replace the value or the rules, delete, rotate the keys.

The value goes in and is encrypted at once; no service returns it. A value replaced or deleted is
retired, not forgotten: kept encrypted (``RetiredSecretValue``) and redacted for
AGENTOPS_SECRET_RETIRED_REDACT_DAYS, since what a command wrote while it was live can come back.
Permissions: the interfaces have found the team through a scoped read; these services check the
model permission (``vault_app.add_secret`` / ``change_secret`` / ``delete_secret``: admins) and the membership.
"""

from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from agentops.domain import Conflict, DomainError, InvalidArguments, NotFound, PermissionDenied
from agentops.models import Team
from agentops.teams import team_ids
from tools_app.secret_refs import MIN_VALUE_CHARS, SECRET_NAME_RE
from vault_app import crypto
from vault_app.models import RetiredSecretValue, Secret
from vault_app.resolve import retired_cutoff

MAX_VALUE_CHARS = 16 * 1024
MAX_ALLOWED_TOOLS = 100


class SecretTooLarge(DomainError):
    """The secret's value is too large."""

    code = "payload_too_large"
    status = 413


def _require(actor: Any, perm: str, team_id: int) -> None:
    if actor is None or not actor.is_active or not actor.has_perm(f"vault_app.{perm}_secret"):
        raise PermissionDenied(f"You need the permission vault_app.{perm}_secret to manage secrets.",
                               details={"permission": f"vault_app.{perm}_secret"})
    teams = team_ids(actor)
    if teams is not None and team_id not in teams:
        raise NotFound("No such team")


def _checked_value(value: str) -> str:
    if len(value) > MAX_VALUE_CHARS:
        raise SecretTooLarge(f"A secret's value is at most {MAX_VALUE_CHARS} characters.",
                             details={"max_chars": MAX_VALUE_CHARS})
    if len(value) < MIN_VALUE_CHARS:
        # A short value would be "redacted" inside unrelated text everywhere, and is guessable.
        raise InvalidArguments(f"A secret's value is at least {MIN_VALUE_CHARS} characters.")
    if value != value.strip() or any(c in value for c in "\r\n\x00"):
        raise InvalidArguments("A secret's value may not start or end with whitespace or contain CR, LF or NUL.")
    return value


def _checked_tools(allowed_tools: list[str]) -> list[str]:
    if len(allowed_tools) > MAX_ALLOWED_TOOLS:
        raise InvalidArguments(f"At most {MAX_ALLOWED_TOOLS} allowed tools.")
    cleaned = []
    for item in allowed_tools:
        if not isinstance(item, str) or not item.strip() or len(item) > 200:
            raise InvalidArguments("allowed_tools holds tool names or glob patterns (1-200 characters).")
        cleaned.append(item.strip())
    return sorted(set(cleaned))


def secret_fields_check(*, name: str | None, value: str | None, allowed_tools: list[str] | None) -> None:
    """The checks of create and update on what a form holds (the admin's form runs them, so a
    refusal shows on the form rather than after a save that did not happen). DomainError."""
    if name is not None and not SECRET_NAME_RE.match(name):
        raise InvalidArguments("A secret's name is 1-100 characters: lower-case letters, digits, _ . - "
                               "(starting with a letter or digit).", details={"field": "name"})
    if value:
        _checked_value(value)
    if allowed_tools is not None:
        _checked_tools(allowed_tools)


@transaction.atomic
def secret_create(*, actor: Any, team_id: int, name: str, value: str, allowed_tools: list[str],
                  description: str = "", expires_at: datetime | None = None) -> Secret:
    """A new secret of the team. Conflict when the team already has one of that name."""
    _require(actor, "add", team_id)
    if not SECRET_NAME_RE.match(name):
        raise InvalidArguments("A secret's name is 1-100 characters: lower-case letters, digits, _ . - "
                               "(starting with a letter or digit).")
    if not Team.objects.filter(pk=team_id).exists():
        raise NotFound("No such team")
    secret = Secret(team_id=team_id, name=name, description=description,
                    ciphertext=crypto.encrypt(_checked_value(value)),
                    allowed_tools=_checked_tools(allowed_tools), expires_at=expires_at,
                    created_by=actor if getattr(actor, "pk", None) else None)
    try:
        with transaction.atomic():
            secret.save()
    except IntegrityError as exc:
        raise Conflict(f"The team already has a secret named {name!r}.", code="secret_exists") from exc
    return secret


def _retire(secret: Secret) -> None:
    """Keep the secret's current value (its ciphertext as stored) in the team's redaction set, and
    drop the team's retired values past the retention period. Call inside atomic() on a locked row.
    Every process's cached redactor (``team_redactor_cached``) picks it up on its next refill."""
    now = timezone.now()
    RetiredSecretValue.objects.filter(team_id=secret.team_id, retired_at__lt=retired_cutoff(now)).delete()
    if settings.AGENTOPS_SECRET_RETIRED_REDACT_DAYS > 0:
        RetiredSecretValue.objects.create(team_id=secret.team_id, name=secret.name, ciphertext=secret.ciphertext,
                                          retired_at=now)


def _locked(secret_id: UUID) -> Secret:
    try:
        return Secret.objects.select_for_update().get(pk=secret_id)
    except Secret.DoesNotExist as exc:
        raise NotFound(f"No secret {secret_id}") from exc


@transaction.atomic
def secret_update(*, actor: Any, secret_id: UUID, value: str | None = None, allowed_tools: list[str] | None = None,
                  description: str | None = None, expires_at: datetime | None = None,
                  clear_expiry: bool = False) -> Secret:
    """Replace the value (write-only), the allowed tools, the description or the expiry."""
    if clear_expiry and expires_at is not None:
        raise InvalidArguments("Give expires_at or clear_expiry, not both", details={"field": "clear_expiry"})
    secret = _locked(secret_id)
    _require(actor, "change", secret.team_id)
    fields = ["updated_at"]
    if value is not None:
        value = _checked_value(value)
        if not _holds(secret, value):  # the old value may still work, and files may hold it
            _retire(secret)
        secret.ciphertext, secret.value_updated_at = crypto.encrypt(value), timezone.now()
        fields += ["ciphertext", "value_updated_at"]
    if allowed_tools is not None:
        secret.allowed_tools = _checked_tools(allowed_tools)
        fields.append("allowed_tools")
    if description is not None:
        secret.description = description
        fields.append("description")
    if expires_at is not None or clear_expiry:
        secret.expires_at = None if clear_expiry else expires_at
        fields.append("expires_at")
    secret.save(update_fields=fields)
    return secret


@transaction.atomic
def secret_delete(*, actor: Any, secret_id: UUID) -> None:
    secret = _locked(secret_id)
    _require(actor, "delete", secret.team_id)
    _retire(secret)  # still redacted: what a command wrote with it outlives the secret
    secret.delete()


def _holds(secret: Secret, value: str) -> bool:
    try:
        return crypto.decrypt(secret.ciphertext) == value
    except crypto.VaultKeyError:
        return False  # unreadable: retire it anyway (rotation keeps it decryptable or it is lost)


def secrets_rotate(*, batch: int = 100) -> dict[str, int]:
    """Re-encrypt every secret, and every retired value still redacted, with the first key. Each
    row is locked and rewritten in its own short transaction, so tool calls go on resolving secrets
    meanwhile (every configured key still decrypts); a row whose value was replaced meanwhile is
    already under the first key. Retired values past the retention period are dropped first; the
    others must be rotated too, or dropping the old key would leave them undecryptable and so no
    longer redacted."""
    RetiredSecretValue.objects.filter(retired_at__lt=retired_cutoff()).delete()
    rotated, current = _rotate_rows(Secret, batch)
    retired_rotated, _ = _rotate_rows(RetiredSecretValue, batch)
    return {"rotated": rotated, "current": current, "retired_rotated": retired_rotated}


def _rotate_rows(model: type[Secret] | type[RetiredSecretValue], batch: int) -> tuple[int, int]:
    """(re-encrypted, already under the first key) of the model's rows, one locked row at a time."""
    rotated = current = 0
    ids: list[Any] = list(model.objects.order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(ids), batch):
        for pk in ids[start:start + batch]:
            with transaction.atomic():
                row = model.objects.select_for_update().filter(pk=pk).first()
                if row is None:
                    continue
                if crypto.encrypted_with_primary(row.ciphertext):
                    current += 1
                    continue
                row.ciphertext = crypto.rotate(row.ciphertext)
                row.save(update_fields=["ciphertext"])
                rotated += 1
    return rotated, current
