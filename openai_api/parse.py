"""Reading the wire's request bodies: what agentops supports is parsed, what it does not is refused.

A feature agentops does not have (hosted environments, vaults, subagents, web search, computer
use, structured output, reasoning settings, auto review…) is refused here with a 400 naming the
parameter: never accepted and then ignored.
"""

import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpRequest

from agentops.parser import UnsafeJSON, json_loads_strict
from tools_app.sandbox.workspace import SANDBOX_MOUNT

MAX_METADATA_PAIRS = 16
MAX_LIMIT = 100
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class WireError(Exception):
    """A request the wire refuses: rendered as ``{"error": {message, type, code, param}}``."""

    def __init__(self, message: str, *, code: str = "invalid_value", param: str | None = None,
                 status: int = 400) -> None:
        super().__init__(message)
        self.message, self.code, self.param, self.status = message, code, param, status


def unsupported(param: str, what: str) -> WireError:
    return WireError(f"agentops does not support {what} ({param}).", code="unsupported_parameter", param=param)


def body(request: HttpRequest) -> dict[str, Any]:
    if not request.body:
        return {}
    try:  # the API's strict reading: no lone surrogate, NUL, NaN, Infinity, 64-bit overflow or deep nesting
        data = json_loads_strict(request.body)
    except UnsafeJSON as exc:
        raise WireError(f"The request body holds JSON agentops does not store: {exc}.", code="invalid_json") from exc
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise WireError("The request body is not valid JSON.", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise WireError("The request body must be a JSON object.", code="invalid_json")
    return data


def list_params(limit: int, order: str) -> tuple[int, str]:
    if not 1 <= limit <= MAX_LIMIT:
        raise WireError(f"limit must be between 1 and {MAX_LIMIT}.", param="limit")
    if order not in ("asc", "desc"):
        raise WireError("order must be 'asc' or 'desc'.", param="order")
    return limit, order


def deep_object(request: HttpRequest, name: str) -> dict[str, str]:
    """``metadata[team]=a`` query parameters as ``{"team": "a"}``."""
    prefix = f"{name}["
    return {key[len(prefix):-1]: str(value) for key, value in request.GET.items()
            if key.startswith(prefix) and key.endswith("]")}


def _known(data: dict[str, Any], allowed: set[str], where: str = "") -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise WireError(f"Unknown parameter: {where}{unknown[0]}.", code="unknown_parameter",
                        param=f"{where}{unknown[0]}")


def _str(data: dict[str, Any], key: str, *, required: bool = False, where: str = "") -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            raise WireError(f"Missing required parameter: {where}{key}.", code="missing_required_parameter",
                            param=f"{where}{key}")
        return None
    if not isinstance(value, str):
        raise WireError(f"{where}{key} must be a string.", param=f"{where}{key}")
    return value


def metadata(value: Any, param: str = "metadata") -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise WireError("metadata must map strings to strings.", param=param)
    if len(value) > MAX_METADATA_PAIRS or any(len(k) > 64 or len(v) > 512 for k, v in value.items()):
        raise WireError("metadata holds at most 16 pairs, keys of 64 and values of 512 characters.", param=param)
    return dict(value)


@dataclass
class FunctionSpec:
    name: str
    description: str
    parameters: dict[str, Any]


def tools(value: Any, param: str = "tools") -> list[FunctionSpec]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise WireError("tools must be a list.", param=param)
    specs = []
    for i, tool in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(tool, dict):
            raise WireError("A tool must be an object.", param=where)
        kind = tool.get("type")
        if kind != "function":
            raise unsupported(f"{where}.type", f"{kind!r} tools; only function tools (client tools, or agentops "
                                               "built-ins by name) run here")
        _known(tool, {"type", "name", "description", "parameters", "strict", "defer_loading", "async"}, f"{where}.")
        if tool.get("defer_loading"):
            raise unsupported(f"{where}.defer_loading", "deferred tool loading (tool search)")
        if tool.get("async"):
            raise unsupported(f"{where}.async", "asynchronous functions")
        name = _str(tool, "name", required=True, where=f"{where}.") or ""
        if not FUNCTION_NAME.match(name):
            raise WireError("A function name is 1 to 64 letters, digits, '_' or '-'.", param=f"{where}.name")
        parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise WireError("parameters must be a JSON Schema object.", param=f"{where}.parameters")
        specs.append(FunctionSpec(name=name, description=_str(tool, "description", where=f"{where}.") or "",
                                  parameters=parameters))
    return specs


def _agent_options(data: dict[str, Any], where: str) -> None:
    """Refuse the agent settings agentops cannot honour (and settings of the wrong type: "high" for
    reasoning was answered 200 and ignored)."""
    for name in ("multi_agent", "reasoning", "text", "compaction", "experimental"):
        if data.get(name) is not None and not isinstance(data[name], dict):
            raise WireError(f"{name} is an object.", param=f"{where}{name}")
    multi = data.get("multi_agent")
    if isinstance(multi, dict) and multi.get("enabled"):
        raise unsupported(f"{where}multi_agent.enabled", "subagents")
    reasoning = data.get("reasoning")
    if isinstance(reasoning, dict) and any(v is not None for v in reasoning.values()):
        raise unsupported(f"{where}reasoning", "reasoning settings")
    if data.get("service_tier") not in (None, "auto", "default"):
        raise unsupported(f"{where}service_tier", "service tiers")
    text = data.get("text")
    if isinstance(text, dict):
        fmt = text.get("format")
        if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
            raise unsupported(f"{where}text.format", "structured output formats")
        if text.get("verbosity") not in (None, "medium"):
            raise unsupported(f"{where}text.verbosity", "verbosity settings")
    compaction = data.get("compaction")
    if isinstance(compaction, dict) and compaction.get("async"):
        raise unsupported(f"{where}compaction.async", "background compaction")
    experimental = data.get("experimental")
    if isinstance(experimental, dict) and experimental.get("time_awareness"):
        raise unsupported(f"{where}experimental.time_awareness", "time-awareness reminders")


AGENT_FIELDS = {"model", "name", "instructions", "metadata", "tools", "multi_agent", "reasoning", "service_tier",
                "text", "compaction", "experimental"}


@dataclass
class AgentSpec:
    model: str
    name: str | None = None
    instructions: str = ""
    metadata: dict[str, str] | None = None
    tools: list[FunctionSpec] = field(default_factory=list)


def agent_create(data: dict[str, Any], where: str = "", *, session: bool = False) -> AgentSpec:
    _known(data, AGENT_FIELDS - ({"name", "metadata"} if session else set()), where)
    _agent_options(data, where)
    return AgentSpec(model=_str(data, "model", required=True, where=where) or "",
                     name=_str(data, "name", where=where), instructions=_str(data, "instructions", where=where) or "",
                     metadata=metadata(data.get("metadata"), f"{where}metadata"),
                     tools=tools(data.get("tools"), f"{where}tools"))


@dataclass
class AgentUpdate:
    fields: dict[str, Any]
    tools: list[FunctionSpec] | None


def agent_update(data: dict[str, Any]) -> AgentUpdate:
    _known(data, AGENT_FIELDS)
    _agent_options(data, "")
    fields: dict[str, Any] = {}
    for key in ("model", "name", "instructions"):
        if key in data:
            value = _str(data, key, required=key == "model")
            fields[key] = value or ("agent" if key == "name" else "")
    if "metadata" in data:
        fields["metadata"] = metadata(data["metadata"]) or {}
    return AgentUpdate(fields=fields, tools=tools(data["tools"]) if "tools" in data else None)


def _input_text(value: Any, param: str) -> str:
    """The text of a wire input: a string, or user messages of ``input_text`` parts."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise WireError("input must be a string or a list of messages.", param=param)
    texts = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") != "user":
            raise WireError("Each input message must be a user message.", param=f"{param}[{i}]")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        if not isinstance(content, list):
            raise WireError("A message's content is a string or a list of input_text parts.",
                            param=f"{param}[{i}].content")
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "input_text":
                raise unsupported(f"{param}[{i}].content[{j}]", "input parts other than input_text")
            if not isinstance(part.get("text"), str):
                raise WireError("An input_text part's text is a string.", param=f"{param}[{i}].content[{j}].text")
            texts.append(part["text"])
    return "\n".join(texts)


WORKSPACE = SANDBOX_MOUNT  # the wire's workspace_directory: where the sandbox mounts the workspace
# Session metadata keys agentops keeps for itself (the wire neither shows nor takes them).
RESERVED_METADATA = ("agentops_environment", "agentops_tools")


@dataclass
class EnvironmentSpec:
    """``none``: no sandbox. ``self_hosted``: agentops's sandbox hosts: the host ``environment_id``
    (an environment of ``environments.list``: a hosted host or your team's runner), the pool
    ``agentops_pool``, or neither (the agent's host pool, as any agentops session)."""
    type: str
    environment_id: str | None = None
    pool: str | None = None


@dataclass
class SessionSpec:
    agent_id: str | None
    agent: AgentSpec | None
    input: str
    metadata: dict[str, str] | None
    stream: bool
    environment: EnvironmentSpec = field(default_factory=lambda: EnvironmentSpec("none"))


def _environment(value: Any) -> EnvironmentSpec:
    if not isinstance(value, dict):
        raise WireError("Missing required parameter: environment.", code="missing_required_parameter",
                        param="environment")
    kind = value.get("type")
    if kind == "none":
        _known(value, {"type"}, "environment.")
        return EnvironmentSpec("none")
    if kind == "openai_hosted":
        raise unsupported("environment.type", "openai_hosted session environments (hosted containers): use "
                                              "{\"type\": \"self_hosted\"} (agentops's sandbox hosts and your "
                                              "runners) or {\"type\": \"none\"} (no sandbox)")
    if kind != "self_hosted":
        raise WireError(f"Unknown environment type {kind!r}.", param="environment.type")
    _known(value, {"type", "workspace_directory", "capability_directories", "environment_id", "agentops_pool"},
           "environment.")
    if value.get("capability_directories"):
        raise unsupported("environment.capability_directories", "capability directories")
    directory = _str(value, "workspace_directory", where="environment.")
    if directory is not None and directory.rstrip("/") != WORKSPACE:
        raise unsupported("environment.workspace_directory", f"a workspace other than {WORKSPACE}: agentops's "
                                                             f"sandbox mounts every session's workspace there")
    host, pool = _str(value, "environment_id", where="environment."), _str(value, "agentops_pool", where="environment.")
    if host is not None and pool is not None:
        raise WireError("Give environment.environment_id (one host) or environment.agentops_pool, not both.",
                        param="environment.agentops_pool")
    return EnvironmentSpec("self_hosted", environment_id=host, pool=pool)


def session_metadata(value: Any) -> dict[str, str] | None:
    meta = metadata(value)
    reserved = sorted(set(meta or {}) & set(RESERVED_METADATA))
    if reserved:
        raise WireError(f"metadata.{reserved[0]} is agentops's own key.", code="invalid_value",
                        param=f"metadata.{reserved[0]}")
    return meta


def session_create(data: dict[str, Any]) -> SessionSpec:
    _known(data, {"environment", "agent_id", "agent", "input", "metadata", "prompt_cache_options", "review",
                  "stream", "stream_options", "vault_ids"})
    environment = _environment(data.get("environment"))
    if data.get("vault_ids"):
        raise unsupported("vault_ids", "vaults")
    if data.get("review") not in (None, "none"):
        raise unsupported("review", "automatic review: agentops's reviewers decide approvals")
    if data.get("prompt_cache_options") is not None:
        raise unsupported("prompt_cache_options", "prompt cache options")
    agent_id = _str(data, "agent_id")
    agent_data = data.get("agent")
    agent = None
    if agent_data is not None:
        if not isinstance(agent_data, dict):
            raise WireError("agent must be an object.", param="agent")
        if agent_id is not None:
            if agent_data:
                raise unsupported(f"agent.{sorted(agent_data)[0]}",
                                  "per-session overrides of a saved agent; update the agent or create another")
        else:
            agent = agent_create(agent_data, "agent.", session=True)
    if agent_id is None and agent is None:
        raise WireError("Give agent_id, or agent with a model.", code="missing_required_parameter", param="agent_id")
    stream = data.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:  # "false" streamed (a JSON answer awaited forever)
        raise WireError("stream is true or false.", param="stream")
    stream = bool(stream)
    text = _input_text(data["input"], "input") if data.get("input") is not None else ""
    if stream and not text.strip() and environment.type != "self_hosted":
        raise WireError("input is required when stream is true (except in a self_hosted environment).",
                        code="missing_required_parameter", param="input")
    return SessionSpec(agent_id=agent_id, agent=agent, input=text, metadata=session_metadata(data.get("metadata")),
                       stream=stream, environment=environment)


def session_update(data: dict[str, Any]) -> dict[str, str] | None:
    """The new metadata (None: unchanged). Agent settings are the saved agent's: update it instead."""
    _known(data, {"agent", "metadata", "prompt_cache_options", "review"})
    if data.get("agent"):
        raise unsupported("agent", "per-session agent settings; update the agent instead")
    if data.get("review") not in (None, "none"):
        raise unsupported("review", "automatic review")
    if data.get("prompt_cache_options") is not None:
        raise unsupported("prompt_cache_options", "prompt cache options")
    if "metadata" not in data:
        return None
    return session_metadata(data["metadata"]) or {}


@dataclass
class Input:
    kind: str  # message | tool_result | cancel | approval
    text: str = ""
    turn_id: str = ""
    call_id: str = ""
    output: str = ""
    success: bool = True
    request_id: str = ""
    decision: str = ""
    reason: str = ""
    seen_hash: str | None = None


def _tool_output(value: Any) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list):
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, dict) and p.get("type") == "input_text")
    return json.dumps(value)


def session_inputs(data: dict[str, Any]) -> list[Input]:
    _known(data, {"events"})
    events = data.get("events")
    if not isinstance(events, list) or not events:
        raise WireError("events must be a non-empty list.", param="events")
    out = []
    for i, event in enumerate(events):
        where = f"events[{i}]"
        if not isinstance(event, dict):
            raise WireError("An event must be an object.", param=where)
        kind = event.get("type")
        if kind == "agent.session.input.message":
            out.append(Input("message", text=_input_text(event.get("input"), f"{where}.input")))
        elif kind == "agent.session.input.tool_result":
            success = event.get("success", True) is not False
            out.append(Input("tool_result", turn_id=_str(event, "turn_id", required=True, where=f"{where}.") or "",
                             call_id=_str(event, "call_id", required=True, where=f"{where}.") or "",
                             success=success,
                             output=_tool_output(event.get("output")) if success
                             else str(event.get("error") or "The tool failed.")))
        elif kind == "agent.session.input.cancel":
            out.append(Input("cancel"))
        elif kind == "agent.session.input.mcp_approval_request_result":
            response = event.get("response")
            if not isinstance(response, dict) or response.get("decision") not in ("approve", "deny", "cancel"):
                raise WireError("response.decision must be approve, deny or cancel.",
                                param=f"{where}.response.decision")
            seen = response.get("arguments_sha256")
            out.append(Input("approval", request_id=_str(event, "request_id", required=True, where=f"{where}.") or "",
                             decision=str(response["decision"]), reason=str(response.get("reason") or ""),
                             seen_hash=seen if isinstance(seen, str) else None))
        elif kind == "agent.session.input.computer_use_approval_request_result":
            raise unsupported(f"{where}.type", "computer use")
        else:
            raise WireError(f"Unknown input event type {kind!r}.", param=f"{where}.type")
    return out

