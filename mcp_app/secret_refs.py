"""The hook where an MCP server's headers and environment resolve ``{{secret:NAME}}`` references.

The secrets vault (issue 15, built separately) plugs its resolver in with
``secret_resolver_set(fn)`` from its AppConfig.ready(). ``fn(text, team_id=, consumer=)`` returns
``text`` with every reference replaced by the value, and raises a ``DomainError`` when a secret is
unknown, expired or not allowed for ``consumer`` (here ``"mcp:<server>"``). It is called only in the
executing task, right before the connection is made; the resolved values are never stored.

Until a resolver is set, a reference is a clear refusal: a server configured with one must not be
called with the literal ``{{secret:...}}`` text as its credential.
"""

import re
from collections.abc import Callable

from agentops.domain import DomainError

SECRET_REF_RE = re.compile(r"\{\{\s*secret:([A-Za-z0-9_.-]+)\s*\}\}")
SecretResolver = Callable[..., str]
_resolver: SecretResolver | None = None


class SecretUnavailable(DomainError):
    code = "secret_unavailable"
    status = 422


def secret_resolver_set(resolver: SecretResolver | None) -> None:
    global _resolver
    _resolver = resolver


def secret_names(values: dict[str, str]) -> list[str]:
    """The secrets a mapping refers to (what a reviewer may be shown: names, never values)."""
    return sorted({m.group(1) for v in values.values() for m in SECRET_REF_RE.finditer(str(v))})


def resolve_references(values: dict[str, str], *, team_id: int, consumer: str) -> dict[str, str]:
    """``values`` with their secret references resolved (in the executing task only)."""
    out = {}
    for key, value in values.items():
        text = str(value)
        if SECRET_REF_RE.search(text):
            if _resolver is None:
                raise SecretUnavailable(f"{consumer} refers to a secret ({key}) but no secrets vault is installed.")
            text = _resolver(text, team_id=team_id, consumer=consumer)
        out[str(key)] = text
    return out
