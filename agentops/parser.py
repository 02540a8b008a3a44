"""The API's JSON parser: only JSON that every layer below can hold.

Python's ``json`` reads more than the database and the engine can take, and each of these was a
500 further down: ``NaN``/``Infinity`` (and ``1e400``, read as infinity), a ``\\u0000`` in a
string (PostgreSQL text and jsonb refuse NUL), a lone surrogate (``\\ud800``: not encodable as
UTF-8), an integer outside 64 bits (a bigint column overflows), and nesting deep enough to make
the serializers recurse. Each is refused here as a parse error: ninja turns it into 400
``malformed_json`` with the reason, before any view runs, so nothing changes.
"""

import json
import math
from typing import Any, NoReturn, cast

from django.http import HttpRequest
from ninja.parser import Parser
from ninja.types import DictStrAny

MAX_DEPTH = 32
INT64 = 2**63


class UnsafeJSON(ValueError):
    """Valid JSON by Python's reading, but not something we store or act on."""


def _refuse_constant(name: str) -> NoReturn:
    raise UnsafeJSON(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnsafeJSON(f"the number {text[:40]} is out of range")
    return value


def _checked_string(value: str, where: str) -> None:
    if "\x00" in value:
        raise UnsafeJSON(f"{where}: a string contains a NUL character (\\u0000)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UnsafeJSON(f"{where}: a string contains a lone surrogate (not valid Unicode)") from exc


def json_check(data: Any) -> None:
    """Walk ``data`` (iteratively: a deep value must not blow the stack here either) and raise
    UnsafeJSON for what the layers below cannot hold."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise UnsafeJSON(f"nested deeper than {MAX_DEPTH} levels")
            if isinstance(value, dict):
                for key, item in value.items():
                    _checked_string(key, "a key")
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            _checked_string(value, "a value")
        elif isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
            raise UnsafeJSON("an integer does not fit in 64 bits")


def json_loads_strict(body: bytes | str) -> Any:
    try:
        data = json.loads(body, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError as exc:
        raise UnsafeJSON(f"nested deeper than {MAX_DEPTH} levels") from exc
    json_check(data)
    return data


class StrictJSONParser(Parser):
    def parse_body(self, request: HttpRequest) -> DictStrAny:
        return cast(DictStrAny, json_loads_strict(request.body))
