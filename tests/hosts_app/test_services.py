"""Sandbox hosts through their services and API: pinning, offline, moving, runner tokens."""

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentops import dispatch
from agentops.runner.protocol import split_token, verify_job
from hosts_app import hooks, runners
from hosts_app.models import AgentHostPolicy, SandboxHost, SessionPlacement
from hosts_app.services import WAKE_REVOKED, host_heartbeat, hosts_mark_offline, session_pin, wake_key
from sessions_app.models import Event, Step
from tests import factories
from tests.helpers import api_client
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db


def pinned(session: Any) -> str:
    placed = session_pin(session=session)
    assert placed is not None
    return placed.name


def host(name: str, **fields: Any) -> SandboxHost:
    hooks.cache_clear()  # an earlier test's "no host at all" must not hide this one
    fields.setdefault("status", "online")
    fields.setdefault("last_heartbeat_at", timezone.now())
    return SandboxHost.objects.create(name=name, **fields)


@pytest.fixture
def operator() -> User:
    return factories.user("op", groups=["operators"])


def test_session_pin_picks_the_least_loaded_host_by_capacity(operator: User) -> None:
    host("a", capacity=1)
    host("b", capacity=4)
    agent = factories.agent_profile()
    first = factories.session(agent=agent, owner=operator)
    assert pinned(first) == "a"  # a tie: by name
    factories.turn(first)  # a working turn: a is full (1/1), b is empty (0/4)
    second = factories.session(agent=agent, owner=operator)
    assert pinned(second) == "b"
    assert pinned(first) == "a"  # pinned once: it keeps its host
    assert Event.objects.filter(session=second, type="session.pinned", payload__host="b").count() == 1


def test_session_pin_needs_the_agent_pool_and_labels(operator: User) -> None:
    host("plain")
    host("gpu-1", labels=["gpu"], pool="ml")
    agent = factories.agent_profile()
    AgentHostPolicy.objects.create(agent=agent, pool="ml", labels=["gpu"])
    assert pinned(factories.session(agent=agent, owner=operator)) == "gpu-1"


def test_no_host_keeps_the_one_machine_path(operator: User) -> None:
    session = factories.session(owner=operator)
    assert session_pin(session=session) is None
    assert hooks.workspace_is_local(session) is True
    assert not SessionPlacement.objects.exists()


def test_with_no_host_a_burst_of_ticks_asks_for_hosts_once(operator: User, monkeypatch: pytest.MonkeyPatch) -> None:
    """While one tick asks whether any host exists, the others keep the last answer and query nothing
    (they used to look up the pin, the candidates and the hosts each, a burst of them under load)."""
    sessions = [factories.session(owner=operator) for _ in range(2)]
    hooks.cache_clear()
    assert hooks.workspace_is_local(sessions[0]) is True  # asked: no host
    asking, answered = threading.Event(), threading.Event()
    real_exists = type(SandboxHost.objects).exists

    def slow_exists(manager: Any) -> bool:
        asking.set()
        assert answered.wait(10)
        return bool(real_exists(manager))

    monkeypatch.setattr(type(SandboxHost.objects), "exists", slow_exists)
    monkeypatch.setattr(hooks, "_hosts_asked_at", time.monotonic() - hooks.NO_HOSTS_SECONDS)  # the answer expired
    def ask() -> None:
        try:
            hooks.workspace_is_local(sessions[0])
        finally:
            connection.close()  # this thread's own connection

    asker = threading.Thread(target=ask)
    asker.start()
    assert asking.wait(10)
    try:
        with CaptureQueriesContext(connection) as queries:
            assert hooks.host_of(sessions[1]) is None
    finally:
        answered.set()
        asker.join(10)
    assert len(queries) == 0, [q["sql"] for q in queries]


def test_a_remote_host_is_never_local_and_an_offline_one_makes_work_wait_visibly(operator: User) -> None:
    host("far", status="offline", last_heartbeat_at=None)
    session = factories.session(owner=operator)
    assert hooks.workspace_is_local(session) is False
    step = factories.step(factories.turn(session), tool_name="run_command")
    assert hooks.tool_queue_for(str(step.id)) == "sandbox.far"
    (event,) = Event.objects.filter(step=step, type="host.waiting")
    assert "far" in event.payload["reason"]


def test_a_silent_host_goes_offline_and_a_heartbeat_brings_it_back() -> None:
    stale = host("stale", last_heartbeat_at=timezone.now() - timedelta(hours=1))
    host("fresh")
    assert hosts_mark_offline() == ["stale"]
    assert host_heartbeat(host_id=stale.id).status == "online"


def test_session_move_refuses_bad_input_and_changes_nothing(operator: User) -> None:
    host("a")
    other_team_runner, _ = runners.runner_create(team=factories.team("other"), name="theirs",
                                                 actor=factories.user(is_superuser=True))
    session = factories.session(owner=operator)
    session_pin(session=session)
    client = api_client(operator)
    for target in ("nope", other_team_runner.name):
        response = client.post(f"/api/sessions/{session.id}/host", {"host": target}, content_type="application/json")
        assert response.status_code == 422, response.content
    factories.step(factories.turn(session), tool_name="run_command", status="approved")
    host("b")
    response = client.post(f"/api/sessions/{session.id}/host", {"host": "b"}, content_type="application/json")
    assert response.status_code == 409 and response.json()["code"] == "session_busy"
    assert SessionPlacement.objects.get(session=session).host.name == "a"
    assert not Event.objects.filter(session=session, type="session.moved").exists()


def test_runner_token_is_hashed_at_rest_and_revocation_is_immediate(operator: User) -> None:
    runner, token = runners.runner_create(team=factories.team(), name="cust", actor=operator)
    row = SandboxHost.objects.filter(pk=runner.pk).values().get()
    secret, _pinned = split_token(token)
    assert secret not in {str(v) for v in row.values()}
    assert runners.runner_authenticate(secret) == runner
    assert runners.runner_authenticate(secret + "x") is None
    assert runners.runner_authenticate(token) is None  # the public key stays on the runner
    runners.runner_revoke(name="cust", actor=operator)
    assert runners.runner_authenticate(secret) is None


def test_host_list_api_costs_the_same_queries_for_more_hosts(operator: User,
                                                            django_assert_num_queries: Any) -> None:
    client = api_client(operator)
    host("a")
    with django_assert_num_queries(3) as first:  # the role, the hosts with their load, the teams
        assert client.get("/api/hosts").status_code == 200
    host("b")
    host("c")
    runners.runner_create(team=factories.team(), name="cust", actor=operator)
    with django_assert_num_queries(len(first.captured_queries)):
        assert len(client.get("/api/hosts").json()) == 4


def test_a_woken_poll_claims_the_step_it_names_for_its_own_sessions_only(operator: User) -> None:
    tool_definitions_seed()
    mine, token = runners.runner_create(team=factories.team(), name="mine", actor=operator)
    theirs, _ = runners.runner_create(team=factories.team(), name="theirs", actor=operator)
    steps = {}
    for runner in (mine, theirs):
        session = factories.session(owner=operator)
        SessionPlacement.objects.create(session=session, host=runner)
        steps[runner.name] = factories.step(factories.turn(session), tool_name="run_command", status="approved",
                                            approval_mode="safe_readonly", arguments={"command": "true"})
    # Woken with the other runner's step: nothing is claimed, that step stays approved.
    assert runners.runner_woken_job(host=mine, message=str(steps["theirs"].id)) is None
    assert Step.objects.get(pk=steps["theirs"].pk).status == "approved"
    envelope = runners.runner_woken_job(host=mine, message=str(steps["mine"].id))
    assert envelope is not None and envelope["job"]["step_id"] == str(steps["mine"].id)
    assert verify_ok(envelope, mine, token)
    claimed = Step.objects.get(pk=steps["mine"].pk)
    assert claimed.status == "running" and claimed.lease_owner == "runner:mine"  # in the claim itself
    assert runners.runner_woken_job(host=mine, message=str(steps["mine"].id)) is None  # claimed once
    # Any other word looks at everything (here: nothing left for this runner).
    assert runners.runner_woken_job(host=mine, message="look") is None


def verify_ok(envelope: dict[str, Any], runner: SandboxHost, token: str) -> bool:
    _secret, pinned_key = split_token(token)
    verify_job(key=pinned_key, runner=runner.name, job=envelope["job"], signature=envelope["signature"])
    return True


def test_revoking_a_runner_wakes_its_long_poll(operator: User, django_capture_on_commit_callbacks: Any) -> None:
    runner, _ = runners.runner_create(team=factories.team(), name="gone", actor=operator)
    client = dispatch.redis_client()
    client.delete(wake_key("gone"))
    with django_capture_on_commit_callbacks(execute=True):
        runners.runner_revoke(name="gone", actor=operator)
    assert client.lrange(wake_key("gone"), 0, -1) == [WAKE_REVOKED.encode()]


def test_a_shared_hosts_load_counts_the_viewers_teams_only(operator: User) -> None:
    """Another team's sessions on the shared host showed as its load ("30 / 8") to anyone with a
    role: that team's activity (a browser audit, 2026-12-04). An admin sees all of it."""
    from sessions_app.services import turn_create

    shared = host("shared")
    theirs = factories.user("olga", groups=["operators"], teams=["other"])
    for owner, agent in ((operator, factories.agent_profile()),
                         (theirs, factories.agent_profile(team=factories.team("other"), slug="theirs"))):
        session = factories.session(owner=owner, agent=agent)
        turn_create(session_id=session.id, input="go")
        SessionPlacement.objects.create(session=session, host=shared)
    admin = factories.user("root", is_superuser=True, is_staff=True, teams=[])
    for user, load in ((operator, 1), (theirs, 1), (admin, 2)):
        (row,) = [h for h in api_client(user).get("/api/hosts").json() if h["name"] == "shared"]
        assert row["active_sessions"] == load, (user.username, row)
