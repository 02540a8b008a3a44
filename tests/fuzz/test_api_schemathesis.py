"""Schemathesis against /api/openapi.json, as an operator and as a reviewer, with data that fits
the schema and data that does not: whatever it sends, the API answers without a 5xx, and every
refusal is a 4xx in the ``{code, message, details}`` shape. Bounded (MAX_EXAMPLES per operation
and mode): 10 under ``make test FULL=1``, 4 in CI (``make test``), every operation either way.

The schema is the one the running application serves, and every case goes through Django's whole
middleware stack (size limit, idempotency, CSRF, authentication) to the real database.
"""

from collections import Counter
from typing import Any

import hypothesis
import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.wsgi import get_wsgi_application
from schemathesis import Case, GenerationMode
from schemathesis.core.transport import Response

from approvals_app import services as approvals
from sessions_app.models import Step
from sessions_app.services import step_transition
from tests import factories
from tests.helpers import api_token, full_or_short
from tools_app.services import tool_definitions_seed

MAX_EXAMPLES = full_or_short(10, 4)


def assert_error_shape(response: Response) -> None:
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"code", "message", "details"}, body
    assert isinstance(body["code"], str) and body["code"], body
    assert isinstance(body["message"], str) and body["message"], body
    assert isinstance(body["details"], dict), body


def fuzz(strategy: Any, headers: dict[str, str], statuses: "Counter[int]", *, ends: bool) -> Any:
    """The hypothesis test of one operation: no 5xx, and every 4xx in the error shape."""
    @hypothesis.given(case=strategy)
    @hypothesis.settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck), phases=[hypothesis.Phase.generate])
    def run(case: Case) -> None:
        if ends:
            case.query = {**(case.query or {}), "max_seconds": 0.2}  # a stream of a real session ends
        response = case.call(headers=headers)
        statuses[response.status_code] += 1
        assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
        if response.status_code >= 400:
            assert_error_shape(response)

    return run


def real_ids(user: User) -> dict[str, str]:
    """Rows for the generated requests to find: an agent ("demo"), a session with an active turn,
    a pending approval and a client tool call waiting for its output."""
    tool_definitions_seed()
    agent = factories.agent_profile(slug="demo")
    session = factories.session(agent=agent, owner=user)
    turn = factories.turn(session)
    step = factories.step(turn, tool_name="run_command", arguments={"command": "make deploy"},
                          approval_mode="mutating")
    approval = approvals.approval_request_create(step_id=step.id)
    client_step = factories.step(turn, tool_name="ask_client", call_id="call_client")
    step_transition(step_id=client_step.id, to=Step.Status.RUNNING)
    return {"session_id": str(session.id), "turn_id": str(turn.id), "request_id": str(approval.request_id)}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("role", ["operator", "reviewer"])
@pytest.mark.django_db(transaction=True)  # each request commits or fails on its own
def test_api_never_500s_and_refuses_in_the_error_shape(role: str, mode: GenerationMode) -> None:
    user: User = factories.user(f"fuzz-{role}", groups=[f"{role}s"])
    ids = real_ids(user)
    headers = {"Authorization": f"Bearer {api_token(user)}"}
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", get_wsgi_application())
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 8, [op.label for op in operations]

    # Generated path parameters (mostly unknown ids), then the ids of real rows: the bodies and
    # queries reach the services with a session, turn and approval to act on. An operation without
    # path parameters runs once (both would generate the same cases).
    runs = [(op, params) for op in operations for params in ((None, ids) if op.path_parameters else (None,))]
    for operation, path_parameters in runs:
        strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters and {
            p.name: path_parameters[p.name] for p in operation.path_parameters if p.name in path_parameters})

        run = fuzz(strategy, headers, statuses,
                   ends=operation.path.endswith("/events/stream") and bool(path_parameters))
        try:
            run()
        except (AssertionError, Exception) as exc:  # noqa: BLE001 - every operation's failure is reported
            failures.append(f"{operation.label}: {exc!r}"[:1500])
    print(f"schemathesis {role} {mode.value}: {len(operations)} operations, "
          f"{sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")
    assert not failures, "\n".join(failures)
