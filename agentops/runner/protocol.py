"""The runner protocol, shared by the server (hosts_app.runners) and the runner: the standard library
and ``cryptography`` only.

A job is a JSON object signed with Ed25519. The server derives each runner's private key from its
own secret (``hosts_app.runner_keys``: never stored, never sent); the runner gets the matching
public key out of band, inside the token it is shown once (``aor_<secret>.<public key>``), and pins
it. On the wire the runner sends only the secret part (``Authorization: Bearer aor_<secret>``); the
database holds the secret's SHA-256 and the public key. Whoever reads a request or the database
can therefore authenticate as the runner, but cannot sign a job it will run.

The runner accepts a job only when (1) the signature verifies under its pinned key, (2) it names
this runner and has not expired, and (3) the run spec it carries hashes to the approval hash it
carries (the approval's own hash, which the server checked before signing), and that spec
describes exactly the tool, arguments, timeout and network to run; and a job runs at most once (the
runner's journal, ``agentops.runner.journal``, refuses one served again). A compromised network path
can therefore neither forge a job, nor change what an approved job runs, nor run it twice.
"""

import base64
import binascii
import hashlib
import json
import time
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

TOKEN_PREFIX = "aor_"
KEY_SEPARATOR = "."  # never in the secret part (token_urlsafe: letters, digits, - and _)


def canonical_json(value: Any) -> str:
    """The same spelling as ``agentops.domain.canonical_json`` (what approval hashes are over)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_key_text(key: Ed25519PrivateKey) -> str:
    """The public half of ``key``, as it is written in a token and stored."""
    return _b64(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def token_with_key(secret: str, public_key: str) -> str:
    """The token a runner is shown once: its secret and the public key it pins."""
    return f"{secret}{KEY_SEPARATOR}{public_key}"


class TokenWithoutKey(ValueError):
    """The token carries no job-signing public key: the runner could not verify any job."""


def split_token(token: str) -> tuple[str, Ed25519PublicKey]:
    """(the secret sent as the bearer token, the pinned public key); TokenWithoutKey when the token
    has none (issued before jobs were signed with Ed25519) or it is not an Ed25519 key."""
    secret, _, key = token.strip().partition(KEY_SEPARATOR)
    if not key:
        raise TokenWithoutKey("the token carries no job-signing public key")
    try:
        return secret, Ed25519PublicKey.from_public_bytes(_unb64(key))
    except (ValueError, binascii.Error) as exc:
        raise TokenWithoutKey("the token's public key is not an Ed25519 key") from exc


def sign(key: Ed25519PrivateKey, job: dict[str, Any]) -> str:
    return _b64(key.sign(canonical_json(job).encode()))


class JobRefused(Exception):
    """The job does not verify; it must not run."""


def spec_sha256(spec: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(spec).encode()).hexdigest()


def verify_job(*, key: Ed25519PublicKey, runner: str, job: dict[str, Any], signature: str,
               now: float | None = None) -> None:
    """Raise JobRefused unless the job is authentic, for this runner, current, and what was approved."""
    if not isinstance(job, dict) or not isinstance(signature, str):
        raise JobRefused("malformed job")
    try:
        key.verify(_unb64(signature), canonical_json(job).encode())
    except (InvalidSignature, ValueError, binascii.Error) as exc:
        raise JobRefused("bad signature") from exc
    if job.get("runner") != runner:
        raise JobRefused(f"job is for runner {job.get('runner')!r}")
    if float(job.get("expires_at", 0)) < (now if now is not None else time.time()):
        raise JobRefused("job expired")
    if job.get("type") == "manifest_check":
        return
    spec = job.get("spec")
    if not isinstance(spec, dict) or spec_sha256(spec) != job.get("approval_sha256"):
        raise JobRefused("approval hash does not match the run spec")
    if job.get("approved_sha256") not in (None, job.get("approval_sha256")):
        raise JobRefused("the run spec is not the one the reviewer approved")
    for field, spec_field in (("tool", "tool"), ("arguments", "arguments"), ("timeout_seconds", "timeout_seconds"),
                              ("network", "network")):
        if job.get(field) != spec.get(spec_field):
            raise JobRefused(f"the job's {field} is not the approved one")
