"""The cursor of both list APIs: opaque, and anything but a cursor the server gave out is a 400."""

import base64
import json

import pytest
from django.contrib.auth.models import User

from tests import factories
from tests.helpers import api_client

pytestmark = pytest.mark.django_db

INVALID_CURSOR = {"code": "invalid_arguments", "message": "Invalid cursor", "details": {"field": "cursor"}}


def _b64(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _cursor(*parts: object) -> str:
    return _b64(json.dumps(list(parts)))


MALFORMED = {
    "not base64": "not-a-cursor!",
    "bad padding": "A",
    "non-ascii": "é" * 20,
    "very long": "A" * 100_000,
    # a NUL byte: refused for any query parameter before the API (tests/agentops/test_bad_input.py)
    "not json": _b64("hello"),
    "json object": _b64('{"a": 1}'),
    "one part": _cursor("2024-01-01T00:00:00+00:00"),
    "three parts": _cursor("2024-01-01T00:00:00+00:00", "1", "x"),
    "not a date": _cursor("yesterday", "1"),
    "naive date": _cursor("2024-01-01T00:00:00", "1"),
    "date out of range": _cursor("0001-01-01T00:00:00+01:00", "1"),
    "a number for a date": _cursor(20240101, "1"),
    "unicode digit key": _cursor("2024-01-01T00:00:00+00:00", "²"),
    "huge key": _cursor("2024-01-01T00:00:00+00:00", "9" * 30),
    "list key": _cursor("2024-01-01T00:00:00+00:00", [1]),
    "null key": _cursor("2024-01-01T00:00:00+00:00", None),  # was a 500: to_python(None) is None
}


@pytest.mark.parametrize("path", ["/api/sessions", "/api/approvals"])
@pytest.mark.parametrize("cursor", list(MALFORMED.values()), ids=list(MALFORMED))
def test_list_api_malformed_cursor_is_400_invalid_arguments(operator: User, path: str, cursor: str) -> None:
    client = api_client(factories.user("both", groups=["operators", "reviewers"]))
    response = client.get(path, {"cursor": cursor})
    assert response.status_code == 400, response.content
    assert response.json() == INVALID_CURSOR


def test_sessions_cursor_survives_an_encoding_round_trip(operator: User) -> None:
    for i in range(3):
        factories.session(owner=operator, title=f"s{i}")
    client = api_client(operator)
    cursor = client.get("/api/sessions?limit=1").json()["next_cursor"]
    assert cursor and cursor.isascii() and len(cursor) < 200
    second = client.get("/api/sessions", {"limit": 1, "cursor": cursor})
    assert second.status_code == 200 and second.json()["items"][0]["title"] == "s1"
