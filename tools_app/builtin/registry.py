"""The built-in tool registry, the structured result every tool returns, and argument validation."""

import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from tools_app.sandbox.progress import OutputBatcher

OUTPUT_CAP_CHARS = 64 * 1024
MAX_ARGUMENTS_BYTES = 4 * 1024 * 1024  # larger argument payloads are refused before parsing them further
ERROR_CODES = ("timeout", "sandbox_error", "invalid_arguments", "limit_exceeded", "denied", "cancelled",
               "unknown_tool", "network_error")


@dataclass
class ToolResult:
    """What a tool call produced.

    ``status`` is ``completed`` when the tool ran to its end (a command's non-zero exit code is
    still ``completed``: the model reads ``exit_code``), ``failed`` when ``error_code`` says why not.
    ``files_changed`` is ``{"created", "modified", "deleted"}`` relative to the workspace;
    ``published_files`` is ``[{"path", "size", "sha256"}]`` for the engine to turn into Artifacts.
    """

    status: str
    output: str = ""
    exit_code: int | None = None
    duration_ms: float = 0.0
    files_changed: dict[str, list[str]] = field(
        default_factory=lambda: {"created": [], "modified": [], "deleted": []})
    published_files: list[dict[str, Any]] = field(default_factory=list)
    error_code: str = ""
    error_message: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failure(cls, code: str, message: str, **kwargs: Any) -> "ToolResult":
        return cls(status="failed", error_code=code, error_message=message, output=message, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The result as stored: NUL characters (``find -print0``, a binary file read) as U+FFFD,
        since PostgreSQL's text and jsonb refuse them and the write of the whole outcome failed."""
        return without_nul(asdict(self))


def without_nul(value: Any) -> Any:
    """``value`` with every NUL character in its strings (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_nul(v) for v in value]
    return value


class ToolError(Exception):
    """Raised inside a tool to end it with a given error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ToolContext:
    workspace: Path
    arguments: dict[str, Any]
    timeout_seconds: int
    network: str
    idempotency_key: str
    should_cancel: Callable[[], bool] | None
    live: OutputBatcher | None = None  # a command's live output goes there (``tools_app.sandbox.progress``)
    env: dict[str, str] | None = None  # extra environment of a sandboxed command (secrets resolved by the engine)


@dataclass(frozen=True)
class BuiltinTool:
    """One built-in tool and the defaults its ToolDefinition row is seeded with.

    ``needs_sandbox`` is False for tools that are quick, touch only the workspace through the
    safe-path helpers and start no process: the engine runs those inline in its tick.
    """

    name: str
    description: str
    parameters_schema: dict[str, Any]
    approval_mode: str
    timeout_seconds: int
    idempotent: bool
    network: str
    needs_sandbox: bool
    handler: Callable[[ToolContext], ToolResult] = field(repr=False, compare=False)


def cap_text(text: str, limit: int = OUTPUT_CAP_CHARS) -> str:
    """Keep the head and the tail and say how much was cut: the end of a log is often what matters."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.Draft202012Validator:
    """Checking a schema and building its validator costs ~1.5 ms; a tool's schema rarely changes."""
    schema = json.loads(schema_json)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def validate_arguments(name: str, schema: dict[str, Any], arguments: Any) -> list[str]:
    """Every way ``arguments`` breaks ``schema``, as short messages (empty when valid)."""
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
    except jsonschema.SchemaError as exc:
        return [f"{name}: the tool's parameter schema is invalid: {exc.message[:200]}"]
    errors = []
    for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(part) for part in error.absolute_path) or "(arguments)"
        message = error.message
        if len(message) > 300:  # messages quote the offending value, which may be megabytes long
            message = message[:150] + " ... " + message[-100:]
        errors.append(f"{where}: {message}")
    return errors
