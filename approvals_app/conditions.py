"""A small declarative condition language over a tool call's arguments (no eval, no Python).

A policy's ``conditions`` is a JSON list; every item must hold (AND)::

    [{"path": "command", "op": "matches", "value": "^rm\\\\b"},
     {"path": "url", "op": "host_in", "value": ["api.example.com"]},
     {"path": "payment.amount", "op": "gt", "value": 1000}]

``path`` walks dicts by key and lists by index (dot-separated). A missing path makes the condition
false. Ops: ``eq``/``ne`` (any JSON value), ``gt``/``gte``/``lt``/``lte`` (numbers), ``matches``
(a regular expression in RE2's syntax, searched, at most 200 characters), ``host_in`` (a list of host names:
the argument, a URL or a bare host, is that host or a subdomain of one), ``contains`` (a substring
of a text, or an element of a list). Validated when a policy is saved: a policy the evaluator
would not understand is never stored.

``matches`` runs on RE2 (linear in the text, no backtracking): with Python's ``re``, an admin's
``^(a+)+$`` against 30 characters of an argument the model chose took 40 s inside the tick, and
the gateway's other sessions stalled with it. RE2 has no lookarounds or backreferences; a
pattern using them is refused when the policy is saved.
"""

import functools
import re
from typing import Any
from urllib.parse import urlsplit

import re2

OPS = ("eq", "ne", "gt", "gte", "lt", "lte", "matches", "host_in", "contains")
MAX_CONDITIONS = 20
MAX_PATTERN = 200
MAX_TEXT = 10_000  # a regex runs over at most this much of an argument
PATH_RE = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")
_MISSING = object()


@functools.lru_cache(maxsize=512)
def _pattern(value: str) -> Any:
    """A compiled RE2 pattern (re2.error when RE2 refuses it); its errors are not logged by RE2."""
    options = re2.Options()
    options.log_errors = False
    return re2.compile(value, options)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def conditions_errors(conditions: Any) -> list[str]:
    """What is wrong with a conditions list ([] when it is valid)."""
    if not isinstance(conditions, list):
        return ["conditions must be a JSON list"]
    if len(conditions) > MAX_CONDITIONS:
        return [f"at most {MAX_CONDITIONS} conditions"]
    errors: list[str] = []
    for i, item in enumerate(conditions):
        where = f"condition {i + 1}"
        if not isinstance(item, dict) or set(item) != {"path", "op", "value"}:
            errors.append(f"{where}: an object with exactly path, op and value")
            continue
        path, op, value = item["path"], item["op"], item["value"]
        if not isinstance(path, str) or not PATH_RE.match(path) or len(path) > 200:
            errors.append(f"{where}: path must be dot-separated names or indexes, e.g. payment.amount")
        if op not in OPS:
            errors.append(f"{where}: op must be one of {', '.join(OPS)}")
        elif op in ("gt", "gte", "lt", "lte") and not _is_number(value):
            errors.append(f"{where}: {op} compares with a number")
        elif op == "matches":
            if not isinstance(value, str) or len(value) > MAX_PATTERN:
                errors.append(f"{where}: matches takes a regular expression of at most {MAX_PATTERN} characters")
            else:
                try:
                    _pattern(value)
                except re2.error as exc:
                    reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) \
                        else str(exc)
                    errors.append(f"{where}: invalid regular expression (RE2 syntax: no lookarounds or "
                                  f"backreferences): {reason}")
        elif op == "host_in" and (not isinstance(value, list) or not value
                                  or not all(isinstance(h, str) and h and len(h) <= 253 for h in value)):
            errors.append(f"{where}: host_in takes a non-empty list of host names")
        elif op == "contains" and not isinstance(value, str | int | float | bool):
            errors.append(f"{where}: contains takes a text or a scalar")
    return errors


def _lookup(arguments: Any, path: str) -> Any:
    node = arguments
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _host_of(value: str) -> str:
    text = value.strip()
    host = urlsplit(text if "://" in text else f"//{text}").hostname or ""
    return host.lower().rstrip(".")


def condition_holds(condition: dict[str, Any], arguments: Any) -> bool:
    """One validated condition against the arguments."""
    actual = _lookup(arguments, condition["path"])
    if actual is _MISSING:
        return False
    op, value = condition["op"], condition["value"]
    if op == "eq":
        return bool(actual == value)
    if op == "ne":
        return bool(actual != value)
    if op in ("gt", "gte", "lt", "lte"):
        if not _is_number(actual):
            return False
        return {"gt": actual > value, "gte": actual >= value, "lt": actual < value, "lte": actual <= value}[op]
    if op == "matches":
        return isinstance(actual, str) and _pattern(value).search(actual[:MAX_TEXT]) is not None
    if op == "host_in":
        if not isinstance(actual, str):
            return False
        host = _host_of(actual)
        return bool(host) and any(host == h.lower() or host.endswith("." + h.lower()) for h in value)
    if op == "contains":
        if isinstance(actual, str):
            return isinstance(value, str) and value in actual
        return isinstance(actual, list) and value in actual
    return False


def conditions_hold(conditions: list[dict[str, Any]], arguments: Any) -> bool:
    return all(condition_holds(c, arguments) for c in conditions)


def describe(condition: dict[str, Any]) -> str:
    """A condition as the reviewer reads it: ``command matches '^rm'``."""
    return f"{condition['path']} {condition['op']} {condition['value']!r}"
