"""The API's JSON renderer (orjson) says what ninja's own renderer says: the same values, Django's
formats for times, and ninja's encoder for what orjson refuses."""

import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from ninja.renderers import JSONRenderer

from agentops.renderers import FastJSONRenderer


def _both(data: object) -> tuple[Any, Any]:
    fast = FastJSONRenderer().render(None, data, response_status=200)  # type: ignore[arg-type]
    ninja = JSONRenderer().render(None, data, response_status=200)  # type: ignore[arg-type]
    return json.loads(fast), json.loads(ninja)


def test_the_same_json_as_ninjas_renderer() -> None:
    data = {"id": uuid.uuid4(), "at": datetime(2026, 12, 2, 7, 30, 1, 123456, tzinfo=UTC),
            "day": date(2026, 12, 2), "price": Decimal("1.50"), "nested": [{"é": "ü", "n": None}],
            "counts": {1: "one"}, "flag": True}
    fast, ninja = _both(data)
    assert fast == ninja
    assert fast["at"] == "2026-12-02T07:30:01.123Z"  # Django's format (milliseconds, Z), not orjson's own


def test_an_integer_orjson_refuses_goes_through_ninjas_encoder() -> None:
    fast, ninja = _both({"big": 2**70})
    assert fast == ninja == {"big": 2**70}
