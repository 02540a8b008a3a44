"""System check: the stored secrets open with the configured keys (a wrong key fails at start-up,
not at the first tool call that needs a secret). Run by ``manage.py check``, ``migrate`` and the
web server's start; ``apps.ready`` already refused a missing or malformed key in every process."""

from typing import Any

from django.core import checks
from django.db import DatabaseError, transaction

from vault_app.crypto import KEYS_SETTING, VaultKeyError, decrypt


def vault_keys_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from vault_app.models import Secret

    try:
        with transaction.atomic():
            tokens = list(Secret.objects.order_by("-value_updated_at").values_list("ciphertext", flat=True)[:3])
    except DatabaseError:
        return []  # no table yet (before migrate) or no database: nothing stored to check
    for token in tokens:
        try:
            decrypt(token)
        except VaultKeyError:
            return [checks.Error(
                f"The stored secrets cannot be decrypted with {KEYS_SETTING}: the key is wrong or the key that "
                "encrypted them was dropped.",
                hint=f"Put the previous key back after the new one in {KEYS_SETTING} (comma-separated), then run "
                     "manage.py vault_rotate before dropping it.",
                id="vault_app.E001")]
    return []


def register() -> None:
    checks.register(vault_keys_check, "vault")
