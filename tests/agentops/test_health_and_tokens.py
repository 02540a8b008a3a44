import logging
import time

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from agentops.models import ApiToken
from agentops.services import api_token_authenticate, api_token_create
from tests import factories
from tests.helpers import admin_edit, api_client, login


@pytest.mark.django_db
def test_agentops_token_prints_token_once_and_stores_only_its_hash(capsys: pytest.CaptureFixture[str]) -> None:
    user = User.objects.create_user("integration")
    call_command("agentops_token", "integration")
    token = capsys.readouterr().out.strip()
    assert token.startswith("aop_") and len(token) > 30
    row = ApiToken.objects.get(user=user)
    assert token not in (row.token_sha256, row.prefix)
    assert api_token_authenticate(token) == user
    assert api_token_authenticate(token + "x") is None


@pytest.mark.django_db
def test_agentops_token_unknown_user_fails_clearly() -> None:
    with pytest.raises(CommandError, match="No user 'ghost'"):
        call_command("agentops_token", "ghost")
    assert ApiToken.objects.count() == 0


@pytest.mark.django_db
def test_agentops_token_revokes_by_prefix_for_good(capsys: pytest.CaptureFixture[str]) -> None:
    user = factories.user("integration", groups=["operators"])
    call_command("agentops_token", "integration", "--name", "ci")
    kept_token = capsys.readouterr().out.strip()
    call_command("agentops_token", "integration", "--name", "laptop")
    token = capsys.readouterr().out.strip()
    assert Client().get("/api/agents", headers={"Authorization": f"Bearer {token}"}).status_code == 200

    call_command("agentops_token", "integration", "--revoke", token)  # the token itself, or its first characters
    assert "1 token(s) of integration revoked; 0 already were." in capsys.readouterr().err
    response = Client().get("/api/agents", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert api_token_authenticate(kept_token) == user  # the user's other token still works
    call_command("agentops_token", "integration", "--revoke", token[:8])
    assert "0 token(s) of integration revoked; 1 already were." in capsys.readouterr().err
    with pytest.raises(CommandError, match="has no token starting with 'aop_nope'"):
        call_command("agentops_token", "integration", "--revoke", "aop_nope")
    with pytest.raises(CommandError, match="at least the first 6 characters"):
        call_command("agentops_token", "integration", "--revoke", "aop")


@pytest.mark.django_db
def test_the_admin_revokes_tokens_by_its_action_and_no_edit_brings_one_back() -> None:
    user = factories.user("integration")
    boss = factories.user("boss", is_staff=True, is_superuser=True)
    row, token = api_token_create(username="integration", name="ci")
    client = login(boss)
    response = client.post("/admin/agentops/apitoken/", {"action": "revoke_tokens", "_selected_action": [row.pk]},
                           follow=True)
    assert "1 token(s) revoked; 0 already were." in response.content.decode()
    assert api_token_authenticate(token) is None

    page = client.get(f"/admin/agentops/apitoken/{row.pk}/change/").content.decode()
    assert 'name="revoked_at' not in page and 'name="user"' not in page  # shown, not editable
    admin_edit(ApiToken.objects.get(pk=row.pk), boss, name="ci-renamed", revoked_at="", user=boss.pk)
    after = ApiToken.objects.get(pk=row.pk)
    assert after.name == "ci-renamed" and after.revoked_at is not None and after.user_id == user.pk
    assert api_token_authenticate(token) is None and user.is_active


@pytest.mark.django_db
def test_roles_exist_with_their_permissions() -> None:
    from django.contrib.auth.models import Group

    reviewers = Group.objects.get(name="reviewers")
    operators = Group.objects.get(name="operators")
    assert reviewers.permissions.filter(codename="decide_approvalrequest").exists()
    assert operators.permissions.filter(codename="operate_agentsession").exists()
    assert not operators.permissions.filter(codename="decide_approvalrequest").exists()
    assert Group.objects.get(name="admins").permissions.count() > 20


def test_healthz_ok_with_database_redis_a_worker_and_a_gateway(workers: None) -> None:
    deadline = time.monotonic() + 10
    while True:
        response = api_client(factories.user()).get("/healthz")
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    body = response.json()
    assert response.status_code == 200, body
    assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"]
    assert body["checks"]["workers"]["count"] >= 1
    assert body["checks"]["gateways"]["count"] >= 1 and body["checks"]["gateways"]["ok"]


@pytest.mark.django_db
def test_healthz_503_names_redis_when_it_is_down(settings) -> None:  # type: ignore[no-untyped-def]
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = api_client(factories.user()).get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert "redis" in body["failing"] and body["checks"]["database"]["ok"] is True


@pytest.mark.django_db
def test_healthz_503_names_workers_and_gateways_when_none_runs(caplog: pytest.LogCaptureFixture) -> None:
    staff = login(factories.user(is_staff=True))
    with caplog.at_level(logging.INFO):
        response = staff.get("/healthz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["workers", "gateways"]
    # One warning that names the failing part, not Django's ERROR "Service Unavailable" per probe.
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name in ("agentops.health", "django.request")] \
        == [("WARNING", "healthz: failing workers, gateways")]


@pytest.mark.django_db
def test_healthz_anonymous_gets_only_ok_or_not(settings) -> None:  # type: ignore[no-untyped-def]
    assert Client().get("/healthz").json() == {"status": "degraded"}  # no worker runs here
    assert Client(headers={"Authorization": "Bearer aop_not-a-token"}).get("/healthz").json() == {"status": "degraded"}
    assert login(factories.user()).get("/healthz").json() == {"status": "degraded"}  # logged in, not staff
    assert set(api_client(factories.user()).get("/healthz").json()) == {"status", "failing", "checks"}


def test_healthz_needs_a_worker_on_the_engine_queue_not_just_any_worker(notify_worker: None) -> None:
    """make run's notifier alone (queue notify) answers pings; no turn runs without a worker on
    the engine queue, so /healthz says degraded and names the queues that are served."""
    staff = login(factories.user(is_staff=True))
    deadline = time.monotonic() + 10
    while True:
        workers = staff.get("/healthz").json()["checks"]["workers"]
        if workers["count"] >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert workers["count"] >= 1 and workers["queues"] == ["notify"], workers
    assert workers["ok"] is False
    assert "no Celery worker consumes the engine queue" in workers["error"]
