"""The script language: the lines of a user message that tell the model what to answer.

See the package docstring for the keywords. A message without keyword lines is prose and plays
the demo (`scripted_model.demo`).
"""

import json
from dataclasses import dataclass
from typing import Any

_KEYWORDS = frozenset({"tool", "parallel", "end", "say", "sleep", "error"})


class ScriptError(ValueError):
    """A line that starts with a script keyword but cannot be played."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as the API carries it
    call_id: str = ""


@dataclass(frozen=True)
class ScriptStep:
    """One model response: tool calls or a final text, plus the modifiers written before it."""

    line_index: int
    tool_calls: tuple[ToolCall, ...] = ()
    text: str | None = None
    sleep_ms: int = 0
    error_status: int | None = None
    retry_after: int | None = None  # seconds, sent as Retry-After with the scripted error


def _parse_line(line: str, line_index: int) -> tuple[str, Any] | None:
    """Return (keyword, value) for a script line, None for prose; raise ScriptError for a broken one."""
    keyword, _, rest = line.partition(" ")
    if keyword not in _KEYWORDS:
        return None
    rest = rest.strip()
    where = f"line {line_index + 1}"
    if keyword in ("parallel", "end"):
        if rest:
            raise ScriptError(f"{where}: `{keyword}` takes no argument")
        return keyword, None
    if keyword == "say":
        return keyword, rest
    if keyword == "error":
        # error <status> [<retry-after seconds>]
        status_text, _, retry_text = rest.partition(" ")
        retry_text = retry_text.strip()
        if not status_text.isdecimal() or (retry_text and not retry_text.isdecimal()):
            raise ScriptError(f"{where}: `error` needs an HTTP status and an optional Retry-After, got {rest!r}")
        number = int(status_text)
        if not 400 <= number <= 599:
            raise ScriptError(f"{where}: `error` needs an HTTP status 400-599, got {number}")
        return keyword, (number, int(retry_text) if retry_text else None)
    if keyword == "sleep":
        if not rest.isdecimal():
            raise ScriptError(f"{where}: `{keyword}` needs a whole number, got {rest!r}")
        return keyword, int(rest)
    name, _, raw_arguments = rest.partition(" ")
    if not name:
        raise ScriptError(f"{where}: `tool` needs a name")
    raw_arguments = raw_arguments.strip() or "{}"
    try:
        arguments = json.loads(raw_arguments)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"{where}: tool arguments are not valid JSON ({exc.msg})") from exc
    if not isinstance(arguments, dict):
        raise ScriptError(f"{where}: tool arguments must be a JSON object")
    return keyword, ToolCall(name=name, arguments=json.dumps(arguments))


def parse_script(text: str) -> list[ScriptStep] | None:
    """Parse a user message into response steps; None when it holds no script lines (plain prose).

    A keyword line that cannot be parsed raises ScriptError only when the message is a script
    (has at least one valid line): a sentence such as "error 5 times today" must not break the demo.
    """
    parsed: list[tuple[int, str, Any]] = []
    broken: list[ScriptError] = []
    for index, raw in enumerate(text.splitlines()):
        try:
            item = _parse_line(raw.strip(), index)
        except ScriptError as exc:
            broken.append(exc)
            continue
        if item is not None:
            parsed.append((index, *item))
    if not parsed:
        return None
    if broken:
        raise broken[0]

    steps: list[ScriptStep] = []
    sleep_ms, error_status, retry_after = 0, None, None
    group: list[ToolCall] | None = None
    group_index = 0
    for index, keyword, value in parsed:
        where = f"line {index + 1}"
        if group is not None and keyword not in ("tool", "end"):
            raise ScriptError(f"{where}: only `tool` lines may appear between `parallel` and `end`")
        if keyword == "sleep":
            sleep_ms += value
        elif keyword == "error":
            error_status, retry_after = value
        elif keyword == "parallel":
            group, group_index = [], index
        elif keyword == "end":
            if group is None:
                raise ScriptError(f"{where}: `end` without `parallel`")
            if not group:
                raise ScriptError(f"{where}: empty `parallel` block")
            steps.append(ScriptStep(group_index, tuple(group), None, sleep_ms, error_status, retry_after))
            group, sleep_ms, error_status, retry_after = None, 0, None, None
        elif keyword == "tool" and group is not None:
            group.append(value)
        else:
            calls = (value,) if keyword == "tool" else ()
            text_value = value if keyword == "say" else None
            steps.append(ScriptStep(index, calls, text_value, sleep_ms, error_status, retry_after))
            sleep_ms, error_status, retry_after = 0, None, None
    if group is not None:
        raise ScriptError(f"line {group_index + 1}: `parallel` without `end`")
    # Modifiers after the last response line apply to the "(script finished)" answer.
    if sleep_ms or error_status is not None:
        steps.append(ScriptStep(len(text.splitlines()), (), None, sleep_ms, error_status, retry_after))
    return steps
