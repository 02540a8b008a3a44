"""JSON text of what the engine stores and relays (events' payloads, new steps), by orjson.

The same JSON as ``json.dumps(value, cls=DjangoJSONEncoder)`` (Django's formats for dates and
times, ids as text), compact and in UTF-8. The standard encoder was ~5 % of a model gateway's CPU
at N = 1,000 sessions (py-spy, bench/concurrency.py): every reply's record dumps its events and
new steps, and the relay to the announcers dumps the events again. Whatever orjson refuses (an
integer past 64 bits) goes through the standard encoder, as before.
"""

import json
from collections.abc import Callable
from typing import Any

import orjson
from django.core.serializers.json import DjangoJSONEncoder

_ENCODER = DjangoJSONEncoder()
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS  # times in Django's format, not orjson's


def dumps(value: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """``value`` as JSON text; ``default`` (else Django's encoder) for what JSON has no type for."""
    try:
        return orjson.dumps(value, default=default or _ENCODER.default, option=_OPTIONS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, default=default or _ENCODER.default)


def loads(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)  # what orjson refuses and the standard decoder reads (an integer past 64 bits)
