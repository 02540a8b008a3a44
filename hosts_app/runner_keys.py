"""The runners' job-signing keys (Ed25519), derived from the server's secret, never stored.

A runner's private key is HMAC-SHA256(``SECRET_KEY``, runner id and token hash), used as an Ed25519
seed: the database holds only the public key (to find which configured secret signs for it) and
the token's hash, so reading the database does not let anyone sign a job, and neither does
reading a runner's requests (they carry the token's secret part, not the key). A new token (see
``runner_token_rotate``) brings a new key pair.

``SECRET_KEY`` rotation: keep the old secret in ``SECRET_KEY_FALLBACKS`` and runners keep working
(the key matching each runner's stored public key is found among them); once a runner's secret is
gone from both, its jobs cannot be signed (``RunnerKeyUnavailable``) until it gets a new token.
"""

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.utils.crypto import salted_hmac

from agentops.domain import DomainError
from agentops.runner.protocol import public_key_text
from hosts_app.models import SandboxHost

KEY_SALT = "agentops.runner.job-signing.ed25519.v2"


class RunnerKeyUnavailable(DomainError):
    """No configured server secret derives this runner's key: it needs a new token."""

    code = "runner_key_unavailable"
    status = 409


def _derive(secret: str, host: SandboxHost) -> Ed25519PrivateKey:
    seed = salted_hmac(KEY_SALT, f"{host.id}:{host.token_hash}", secret=secret, algorithm="sha256").digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


def runner_public_key(host: SandboxHost) -> str:
    """The public key of ``host``'s current token under the current ``SECRET_KEY`` (set its
    ``token_hash`` first): what is stored and written into the token."""
    return public_key_text(_derive(settings.SECRET_KEY, host))


def runner_signing_key(host: SandboxHost) -> Ed25519PrivateKey:
    """The private key matching the public key the runner pinned; RunnerKeyUnavailable when no
    configured secret derives it (``SECRET_KEY`` changed without the old one kept as a fallback)."""
    if host.public_key:
        for secret in (settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])):
            key = _derive(secret, host)
            if public_key_text(key) == host.public_key:
                return key
    raise RunnerKeyUnavailable(
        f"Runner {host.name}'s job-signing key derives from no configured server secret (DJANGO_SECRET_KEY "
        f"changed without the old one in SECRET_KEY_FALLBACKS, or a token from before signed jobs): give it a "
        f"new token with POST /api/runners/{host.name}/token.")
