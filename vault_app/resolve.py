"""Secrets at run time: the one place a value is decrypted, inside the task that runs the call.

``secrets_resolve`` swaps the ``{{secret:NAME}}`` references of a call's values (``http_request``
arguments, a command's environment, an MCP server's headers or env) for the values, after checking
each secret exists in the team, has not expired and allows this tool; otherwise it raises
``SecretRefused`` and nothing may run. ``team_redactor`` gives the redactor every stored output of
the team's sessions goes through: every secret of the team, whichever the call used (a value can
come back later, e.g. from a file a command wrote), and the values its secrets had until they were
replaced or deleted in the last AGENTOPS_SECRET_RETIRED_REDACT_DAYS (a rotated credential often
still works, and the file written with it is still there).

Use from a tool source (the MCP client, for one)::

    resolved = secrets_resolve(team_id=server.team_id, tool_name="tracker__open", values=server.headers)
    try:
        result = call(headers=resolved.values)
    finally:
        result = resolved.redactor.value(result)   # before anything is stored
"""

import fnmatch
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from agentops.domain import DomainError
from tools_app.secret_refs import Redactor, references_in, substitute
from vault_app.crypto import VaultKeyError, decrypt
from vault_app.models import RetiredSecretValue, Secret

log = logging.getLogger(__name__)


class SecretRefused(DomainError):
    """A call names a secret it may not use: unknown, expired or not allowed for this tool."""

    code = "secret_refused"
    status = 403


@dataclass(frozen=True)
class Resolved:
    values: Any  # the input with the references replaced: pass it to the call, never store it
    used: list[str]  # the names of the secrets the call uses
    redactor: Redactor  # every secret of the team: apply it to whatever the call produced


def tool_allowed(secret: Secret, tool_name: str) -> bool:
    return any(fnmatch.fnmatchcase(tool_name, pattern) for pattern in secret.allowed_tools or [])


def secrets_check(*, team_id: int | None, tool_name: str, values: Any) -> list[str]:
    """The names ``values`` references, after checking each may be used by ``tool_name`` now
    (no decryption). Raises SecretRefused."""
    names = references_in(values)
    if not names:
        return []
    if team_id is None:
        raise SecretRefused("This session belongs to no team, so it can use no secret.",
                            details={"secrets": names})
    found = {s.name: s for s in Secret.objects.filter(team_id=team_id, name__in=names).defer("ciphertext")}
    now = timezone.now()
    for name in names:
        secret = found.get(name)
        if secret is None:
            raise SecretRefused(f"There is no secret named {name!r} in this team's vault; the call did not run.",
                                code="secret_unknown", details={"secret": name})
        if secret.expires_at is not None and secret.expires_at <= now:
            raise SecretRefused(f"The secret {name!r} expired at {secret.expires_at.isoformat()}; the call did "
                                "not run.", code="secret_expired", details={"secret": name})
        if not tool_allowed(secret, tool_name):
            raise SecretRefused(f"The tool {tool_name!r} is not allowed to use the secret {name!r}; the call did "
                                "not run.", code="secret_not_allowed", details={"secret": name, "tool": tool_name})
    return names


def retired_cutoff(now: datetime | None = None) -> datetime:
    """Values retired before this are no longer redacted (and are dropped at the next write)."""
    return (now or timezone.now()) - timedelta(days=settings.AGENTOPS_SECRET_RETIRED_REDACT_DAYS)


def team_redactor(team_id: int | None) -> Redactor:
    """A redactor of every secret of the team and of its values retired within the retention
    period (two queries; values decrypted in memory only)."""
    if team_id is None:
        return Redactor({})
    values: dict[str, str] = {}
    for name, token in Secret.objects.filter(team_id=team_id).values_list("name", "ciphertext"):
        try:
            values[name] = decrypt(token)
        except VaultKeyError:
            log.error("secret %r of team %s cannot be decrypted with the configured keys", name, team_id)
    retired: list[tuple[str, str]] = []
    for name, token in RetiredSecretValue.objects.filter(
            team_id=team_id, retired_at__gte=retired_cutoff()).values_list("name", "ciphertext"):
        try:
            retired.append((name, decrypt(token)))
        except VaultKeyError:
            log.error("a retired value of secret %r of team %s cannot be decrypted with the configured keys: it is "
                      "no longer redacted", name, team_id)
    return Redactor(values, retired=retired)


_CACHE_SECONDS = 2.0
_cache: dict[int, tuple[float, Redactor]] = {}
_cache_lock = threading.Lock()


def team_redactor_cached(team_id: int | None) -> Redactor:
    """``team_redactor`` kept for 2 s per process: the inline read-only tools run many times a
    second and must not add a query each (a secret created meanwhile is covered 2 s later; a value
    replaced or deleted meanwhile is still in the kept one, and retired in the next)."""
    if team_id is None:
        return Redactor({})
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(team_id)
    if hit is not None and hit[0] > now:
        return hit[1]
    redactor = team_redactor(team_id)
    with _cache_lock:
        _cache[team_id] = (now + _CACHE_SECONDS, redactor)
    return redactor


def secrets_resolve(*, team_id: int | None, tool_name: str, values: Any) -> Resolved:
    """``values`` with its references resolved for one call of ``tool_name`` by the team. Raises
    SecretRefused (unknown, expired, not allowed, or not decryptable with the configured keys)."""
    names = secrets_check(team_id=team_id, tool_name=tool_name, values=values)
    redactor = team_redactor(team_id)
    if not names:
        return Resolved(values=values, used=[], redactor=redactor)
    assert team_id is not None  # secrets_check refused a session without a team
    plain: dict[str, str] = {}
    for name, token in Secret.objects.filter(team_id=team_id, name__in=names).values_list("name", "ciphertext"):
        try:
            plain[name] = decrypt(token)
        except VaultKeyError as exc:
            raise SecretRefused(f"The secret {name!r} cannot be decrypted with the configured keys; the call did "
                                "not run.", code="secret_unavailable", details={"secret": name}) from exc
    missing = sorted(set(names) - set(plain))
    if missing:  # deleted between the check and now
        raise SecretRefused(f"There is no secret named {missing[0]!r} in this team's vault; the call did not run.",
                            code="secret_unknown", details={"secret": missing[0]})
    return Resolved(values=substitute(values, plain), used=names, redactor=redactor)


def text_resolve(text: str, *, team_id: int, consumer: str) -> str:
    """One string with its references resolved for ``consumer`` (the MCP hook: ``mcp:<server>``;
    a secret allows it with ``mcp:<server>`` or a pattern such as ``mcp:*`` in allowed_tools).
    Raises the MCP app's SecretUnavailable, carrying the vault's refusal code and message."""
    from mcp_app.secret_refs import SecretUnavailable

    try:
        return str(secrets_resolve(team_id=team_id, tool_name=consumer, values=text).values)
    except SecretRefused as exc:
        raise SecretUnavailable(exc.message, code=exc.code, details=exc.details) from exc


def call_secret_inputs(*, tool_name: str, arguments: Any, env: dict[str, str], fields: tuple[str, ...],
                       refusal: Callable[[dict[str, Any]], str] | None = None) -> dict[str, Any]:
    """What of a call may reference secrets: the argument ``fields`` the tool allows (e.g.
    http_request's url and headers) and its command environment. SecretRefused
    (``secret_not_allowed_here``) for a reference anywhere else in the arguments, or where the
    tool's ``refusal`` finds one it refuses inside those fields (http_request: a URL's host)."""
    arguments = arguments if isinstance(arguments, dict) else {}
    reason = refusal(arguments) if refusal is not None else ""
    if reason:
        raise SecretRefused(reason, code="secret_not_allowed_here",
                            details={"secrets": references_in(arguments), "tool": tool_name})
    elsewhere = references_in({key: value for key, value in arguments.items() if key not in fields})
    if elsewhere:
        where = ", ".join(fields) if fields else "none of its arguments"
        raise SecretRefused(f"{tool_name} may reference secrets only in: {where}; {{{{secret:{elsewhere[0]}}}}} is "
                            "elsewhere. The call did not run.", code="secret_not_allowed_here",
                            details={"secret": elsewhere[0], "fields": list(fields)})
    return {"arguments": {key: value for key, value in arguments.items() if key in fields}, "env": env}


def secret_refusal_result(exc: SecretRefused) -> dict[str, Any]:
    """A refusal as a tool result the model can read (no value in it: there is none to put)."""
    return {"status": "failed", "error_code": exc.code, "error_message": exc.message, "output": exc.message,
            "data": exc.details}
