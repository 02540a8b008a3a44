"""docs/openai-endpoints.md is the truth: it lists the SDK's 57 endpoints, each one is a route of the
wire that answers in the envelope (never Django's own 404/405), and what it calls refused is refused."""

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from sessions_app.engine.commands import session_start
from tests import factories
from tests.helpers import api_client

pytestmark = pytest.mark.django_db

TABLE = Path(__file__).resolve().parents[2] / "docs" / "openai-endpoints.md"
ROW = re.compile(r"^\| `(GET|POST|DELETE) (/[^`]*)` \| `([^`]+)` \| (supported|mapped|refused) \|(.*)\|$")
ROWS = [m.groups() for line in TABLE.read_text().splitlines() if (m := ROW.match(line))]


def test_the_table_lists_the_sdks_57_endpoints_once_each() -> None:
    assert len(ROWS) == 57
    assert len({(method, path) for method, path, *_ in ROWS}) == 57
    assert len({sdk for _, _, sdk, *_ in ROWS}) == 57


@pytest.fixture
def wire_client(operator: User) -> Client:
    operator.user_permissions.add(*Permission.objects.filter(
        content_type__app_label__in=["sessions_app", "vault_app"],
        codename__in=["add_agentprofile", "change_agentprofile", "delete_agentprofile", "add_secret",
                      "change_secret", "delete_secret", "view_secret"]))
    return api_client(operator)


@pytest.mark.parametrize(("method", "path", "sdk", "status", "mapping"), ROWS, ids=[r[2] for r in ROWS])
def test_each_endpoint_is_a_route_that_answers_in_the_envelope(wire_client: Client, operator: User, method: str,
                                                              path: str, sdk: str, status: str, mapping: str) -> None:
    session = session_start(agent=factories.agent_profile(), owner=operator)[0]
    # The live event stream never ends on a real session: an unknown one answers at once.
    sid = str(uuid.uuid4()) if sdk == "sessions.events.stream" else str(session.id)
    url = "/openai/v1" + path
    for name in re.findall(r"\{(\w+)\}", path):  # ids that do not exist, but the session's
        url = url.replace(f"{{{name}}}", sid if name == "session_id" else f"x_{name}")
    response = wire_client.generic(method, url, "{}", content_type="application/json", HTTP_OPENAI_BETA="agents=v1")
    assert response["Content-Type"].startswith("application/json"), f"{response.status_code} {response.content[:200]!r}"
    body: dict[str, Any] = json.loads(response.content)
    if response.status_code >= 400:
        assert set(body) == {"error"} and body["error"]["message"] and body["error"]["code"], body
        assert response.status_code in (400, 404), body
        # The wire's own 404 (a route that looked), not the site's "No such API endpoint." (none matched).
        assert response.status_code == 400 or body["error"]["type"] == "not_found_error", body
    else:
        assert status != "refused" or body.get("data") == [], body  # a refused list lists nothing
    if status == "refused" and method == "POST" and "{" not in path:
        assert response.status_code == 400 and body["error"]["code"] == "unsupported_feature", body
