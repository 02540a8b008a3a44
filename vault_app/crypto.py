"""The vault's keys (AGENTOPS_SECRET_KEYS) and encryption at rest.

``AGENTOPS_SECRET_KEYS`` is a comma-separated list of Fernet keys: the first encrypts, every one
decrypts (``MultiFernet``). Rotation without downtime: put a new key first and keep the old one
after it on every process, run ``manage.py vault_rotate`` (re-encrypts each row with the new key,
one short transaction per row), then drop the old key. With ``AGENTOPS_DEMO`` on and no key set,
a demo key is derived from ``SECRET_KEY``, so ``make run`` works out of the box (local use only).
"""

import base64
import functools
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

KEYS_SETTING = "AGENTOPS_SECRET_KEYS"


class VaultKeyError(Exception):
    """A stored value cannot be decrypted with the configured keys (a wrong or dropped key)."""


def demo_key(secret_key: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(b"agentops-vault-demo:" + secret_key.encode()).digest()).decode()


def configured_keys() -> list[str]:
    keys = [key.strip() for key in getattr(settings, KEYS_SETTING, []) or [] if key.strip()]
    if not keys and getattr(settings, "AGENTOPS_DEMO", False):
        keys = [demo_key(settings.SECRET_KEY)]
    return keys


@functools.lru_cache(maxsize=4)
def _multi(keys: tuple[str, ...]) -> MultiFernet:
    fernets = []
    for position, key in enumerate(keys, start=1):
        try:
            fernets.append(Fernet(key.encode()))
        except (ValueError, TypeError) as exc:
            raise ImproperlyConfigured(
                f"{KEYS_SETTING}: key #{position} is not a Fernet key (32 url-safe base64-encoded bytes). Make one "
                "with: python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"
            ) from exc
    return MultiFernet(fernets)


def vault_keys() -> MultiFernet:
    """The configured keys; ImproperlyConfigured (a clear start-up error) when none or a bad one."""
    keys = configured_keys()
    if not keys:
        raise ImproperlyConfigured(
            f"{KEYS_SETTING} is not set: the secrets vault needs at least one Fernet key (comma-separated, the "
            "first encrypts). Make one with: python -c 'from cryptography.fernet import Fernet; "
            "print(Fernet.generate_key().decode())' (AGENTOPS_DEMO=1 derives a local demo key instead).")
    return _multi(tuple(keys))


def encrypt(value: str) -> str:
    return vault_keys().encrypt(value.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return vault_keys().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise VaultKeyError(f"a stored secret cannot be decrypted with {KEYS_SETTING} (wrong or dropped key?)") \
            from exc


def encrypted_with_primary(token: str) -> bool:
    """Is ``token`` encrypted with the first (current) key? What rotation has left to do."""
    primary = Fernet(configured_keys()[0].encode())
    try:
        primary.decrypt(token.encode())
    except InvalidToken:
        return False
    return True


def rotate(token: str) -> str:
    """``token`` re-encrypted with the first key (VaultKeyError when no configured key opens it)."""
    try:
        return vault_keys().rotate(token.encode()).decode()
    except InvalidToken as exc:
        raise VaultKeyError(f"a stored secret cannot be decrypted with {KEYS_SETTING}") from exc
