"""Encryption at rest, key rotation without downtime, and the start-up errors of a missing,
malformed or wrong key."""

import os
import subprocess
import sys
import threading

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from tests import factories
from tests.helpers import ROOT, database_url
from vault_app import crypto
from vault_app.models import Secret
from vault_app.resolve import secrets_resolve
from vault_app.services import secret_create

VALUE = "tok-8f3a91c2d4e5b6a7"


@pytest.fixture
def admin(db: None):  # type: ignore[no-untyped-def]
    return factories.user("vault-admin", is_superuser=True, is_staff=True)


def test_secret_create_encrypts_at_rest_and_round_trips(settings, admin) -> None:  # type: ignore[no-untyped-def]
    settings.AGENTOPS_SECRET_KEYS = [Fernet.generate_key().decode()]
    secret = secret_create(actor=admin, team_id=factories.team().pk, name="api_token", value=VALUE,
                           allowed_tools=["http_request"])
    stored = Secret.objects.get(pk=secret.pk).ciphertext
    assert VALUE not in stored and VALUE.encode().hex() not in stored
    assert crypto.decrypt(stored) == VALUE
    resolved = secrets_resolve(team_id=secret.team_id, tool_name="http_request",
                               values={"h": "Bearer {{secret:api_token}}"})
    assert resolved.values == {"h": f"Bearer {VALUE}"} and resolved.used == ["api_token"]


@pytest.mark.django_db(transaction=True)
def test_vault_rotate_reencrypts_while_calls_keep_resolving(settings, admin) -> None:  # type: ignore[no-untyped-def]
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.AGENTOPS_SECRET_KEYS = [old]
    team = factories.team()
    for n in range(5):
        secret_create(actor=admin, team_id=team.pk, name=f"s{n}", value=f"{VALUE}-{n}", allowed_tools=["*"])
    settings.AGENTOPS_SECRET_KEYS = [new, old]  # step 1: every process gets the new key first
    failures: list[str] = []
    resolved = [0]
    stop = threading.Event()

    def resolve_meanwhile() -> None:  # a tool call resolving during the rotation: no downtime
        from django.db import connection
        try:
            while not stop.is_set() or resolved[0] < 3:
                got = secrets_resolve(team_id=team.pk, tool_name="x", values="{{secret:s3}}").values
                resolved[0] += 1
                if got != f"{VALUE}-3":
                    failures.append(got)
        except Exception as exc:  # noqa: BLE001 - any error is a failed resolution: the test reports it
            failures.append(repr(exc))
        finally:
            connection.close()

    thread = threading.Thread(target=resolve_meanwhile)
    thread.start()
    try:
        call_command("vault_rotate", stdout=(out := __import__("io").StringIO()))
    finally:
        stop.set()
        thread.join()
    assert failures == [] and resolved[0] >= 3
    assert "5 secret(s) re-encrypted" in out.getvalue()
    settings.AGENTOPS_SECRET_KEYS = [new]  # step 3: the old key is dropped
    assert [crypto.decrypt(t) for t in Secret.objects.order_by("name").values_list("ciphertext", flat=True)] == [
        f"{VALUE}-{n}" for n in range(5)]
    settings.AGENTOPS_SECRET_KEYS = [new, old]
    call_command("vault_rotate", stdout=(again := __import__("io").StringIO()))
    assert "0 secret(s) re-encrypted" in again.getvalue() and "5 already" in again.getvalue()


def test_wrong_key_fails_the_system_check(settings, admin) -> None:  # type: ignore[no-untyped-def]
    settings.AGENTOPS_SECRET_KEYS = [Fernet.generate_key().decode()]
    secret_create(actor=admin, team_id=factories.team().pk, name="api_token", value=VALUE, allowed_tools=[])
    call_command("check")  # the right key: clean
    settings.AGENTOPS_SECRET_KEYS = [Fernet.generate_key().decode()]
    with pytest.raises(SystemCheckError, match="vault_app.E001"):
        call_command("check")


def test_missing_or_malformed_key_is_a_startup_error(settings) -> None:  # type: ignore[no-untyped-def]
    settings.AGENTOPS_DEMO, settings.AGENTOPS_SECRET_KEYS = False, []
    with pytest.raises(ImproperlyConfigured, match="AGENTOPS_SECRET_KEYS is not set"):
        crypto.vault_keys()
    settings.AGENTOPS_SECRET_KEYS = ["not-a-key"]
    with pytest.raises(ImproperlyConfigured, match="key #1 is not a Fernet key"):
        crypto.vault_keys()
    settings.AGENTOPS_DEMO, settings.AGENTOPS_SECRET_KEYS = True, []
    assert crypto.configured_keys() == [crypto.demo_key(settings.SECRET_KEY)]  # make run works out of the box


@pytest.mark.django_db
def test_a_process_with_a_malformed_key_refuses_to_start() -> None:
    env = {**os.environ, "DATABASE_URL": database_url(), "AGENTOPS_SECRET_KEYS": "short,also-bad",
           "DJANGO_SETTINGS_MODULE": "agentops.settings"}
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "AGENTOPS_SECRET_KEYS: key #1 is not a Fernet key" in proc.stderr
