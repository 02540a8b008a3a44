"""Parsing the wire's vault-credential and environment requests (``openai_api.resources_api``);
the rest of the wire's parsing is ``openai_api.parse``."""

import re
from dataclasses import dataclass
from typing import Any

from openai_api.parse import WireError, _known, _str, metadata, unsupported

RUNNER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


@dataclass
class CredentialSpec:
    name: str = ""
    value: str = ""
    allowed_tools: list[str] | None = None
    description: str | None = None


def _credential_metadata(value: Any, spec: CredentialSpec) -> None:
    """``metadata`` holds what an agentops secret has besides its value: ``allowed_tools``
    (comma-separated tool names or globs: who may use it) and ``description``. Other keys would
    be stored nowhere: refused."""
    meta = metadata(value)
    if meta is None:
        return
    unknown = sorted(set(meta) - {"allowed_tools", "description"})
    if unknown:
        raise unsupported(f"metadata.{unknown[0]}", "credential metadata other than allowed_tools (comma-separated "
                                                    "tool names or globs) and description")
    if "allowed_tools" in meta:
        spec.allowed_tools = [t.strip() for t in meta["allowed_tools"].split(",") if t.strip()]
    if "description" in meta:
        spec.description = meta["description"]


def _credential_auth(value: Any, name: str | None) -> str:
    """The secret's value from ``auth`` (an ``environment_variable`` credential)."""
    if not isinstance(value, dict):
        raise WireError("auth must be an object.", param="auth")
    kind = value.get("type")
    if kind in ("mcp_oauth", "static_bearer"):
        raise unsupported("auth.type", f"{kind} credentials; store the token as an environment_variable credential "
                                       "and reference it as {{secret:NAME}} in the MCP server's headers")
    if kind != "environment_variable":
        raise WireError(f"Unknown credential auth type {kind!r}.", param="auth.type")
    _known(value, {"type", "secret_name", "secret_value", "networking"}, "auth.")
    networking = value.get("networking")
    if isinstance(networking, dict) and networking.get("type") not in (None, "unrestricted"):
        raise unsupported("auth.networking", "host-limited credentials: agentops limits a secret to tools "
                                             "(metadata.allowed_tools)")
    secret_name = _str(value, "secret_name", where="auth.")
    if secret_name is not None and name is not None and secret_name != name:
        raise WireError("auth.secret_name must equal name: an agentops secret has one name, used as "
                        "{{secret:NAME}}.", param="auth.secret_name")
    return _str(value, "secret_value", required=True, where="auth.") or ""


def credential_create(data: dict[str, Any]) -> CredentialSpec:
    _known(data, {"name", "auth", "metadata"})
    spec = CredentialSpec(name=_str(data, "name", required=True) or "")
    spec.value = _credential_auth(data.get("auth"), spec.name)
    _credential_metadata(data.get("metadata"), spec)
    return spec


def credential_update(data: dict[str, Any]) -> CredentialSpec:
    """A rotation (``auth``) and/or new ``metadata`` (replaces allowed_tools and description)."""
    _known(data, {"auth", "metadata"})
    spec = CredentialSpec()
    if data.get("auth") is not None:
        spec.value = _credential_auth(data["auth"], None)
    if "metadata" in data:
        spec.allowed_tools, spec.description = [], ""
        _credential_metadata(data["metadata"] or {}, spec)
    return spec


@dataclass
class RunnerSpec:
    name: str
    team: str | None
    pool: str
    labels: list[str]


def environment_create(data: dict[str, Any]) -> RunnerSpec:
    """``{"environment": {"type": "self_hosted", …}, "agentops_runner": {"name", "team"?, "pool"?,
    "labels"?}}``: a customer runner. Hosted environments (and ``none``, which is no resource) are refused."""
    _known(data, {"environment", "vault_ids", "agentops_runner"})
    env = data.get("environment")
    if not isinstance(env, dict):
        raise WireError("Missing required parameter: environment.", code="missing_required_parameter",
                        param="environment")
    kind = env.get("type")
    if kind == "openai_hosted":
        raise WireError("agentops does not support openai_hosted environments (hosted containers, templates, "
                        "packages, network policies): create a self_hosted environment (an agentops runner), or "
                        "start sessions with environment {\"type\": \"none\"} (agentops's own sandbox hosts).",
                        code="unsupported_feature", param="environment.type")
    if kind == "none":
        raise WireError("An environment of type none is no resource to create: start sessions with environment "
                        "{\"type\": \"none\"}.", code="unsupported_feature", param="environment.type")
    if kind != "self_hosted":
        raise WireError(f"Unknown environment type {kind!r}.", param="environment.type")
    _known(env, {"type", "workspace_directory", "capability_directories"}, "environment.")
    if env.get("capability_directories"):
        raise unsupported("environment.capability_directories", "capability directories")
    if data.get("vault_ids"):
        raise unsupported("vault_ids", "vaults attached to an environment: a runner uses its team's vault")
    runner = data.get("agentops_runner")
    if not isinstance(runner, dict):
        raise WireError("A self_hosted environment is an agentops runner: give agentops_runner {\"name\": …, "
                        "\"team\": …, \"pool\": …} (extra_body in the SDK).", code="missing_required_parameter",
                        param="agentops_runner")
    _known(runner, {"name", "team", "pool", "labels"}, "agentops_runner.")
    name = _str(runner, "name", required=True, where="agentops_runner.") or ""
    if not RUNNER_NAME.match(name):
        raise WireError("A runner's name is 1-64 lower-case letters, digits, '_' or '-'.", param="agentops_runner.name")
    pool = _str(runner, "pool", where="agentops_runner.") or "default"
    if not RUNNER_NAME.match(pool):
        raise WireError("A pool's name is 1-64 lower-case letters, digits, '_' or '-'.", param="agentops_runner.pool")
    labels = runner.get("labels") or []
    if not isinstance(labels, list) or not all(isinstance(x, str) and x for x in labels) or len(labels) > 20:
        raise WireError("labels must be a list of at most 20 strings.", param="agentops_runner.labels")
    return RunnerSpec(name=name, team=_str(runner, "team", where="agentops_runner."), pool=pool, labels=labels)
