"""Settings of a real deployment (issue 12, point 8): the secret key, passwords, login
throttling, the API docs without a CDN, artifacts as attachments."""

import os
import re
import subprocess
import sys
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import Client

from tests import factories
from tests.helpers import ROOT, login

SETUP = "import django; django.setup(); print('started')"


def start(**env: str) -> subprocess.CompletedProcess[str]:
    """Load the settings in a fresh process, as daphne, a worker or manage.py does."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("AGENTOPS_DEMO", "DJANGO_DEBUG", "DJANGO_SECRET_KEY", "AGENTOPS_SECRET_KEYS")}
    return subprocess.run([sys.executable, "-c", SETUP], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**base, "DJANGO_SETTINGS_MODULE": "agentops.settings", **env})


def test_settings_refuse_the_development_secret_key_outside_debug_and_demo() -> None:
    refused = start()
    assert refused.returncode != 0 and "started" not in refused.stdout
    assert "DJANGO_SECRET_KEY is the development key" in refused.stderr
    placeholder = start(DJANGO_SECRET_KEY="change-me-to-50-random-characters")  # .env.example's
    assert placeholder.returncode != 0 and "refusing to start" in placeholder.stderr
    assert start(AGENTOPS_DEMO="1").stdout.strip() == "started"  # the vault derives its demo key
    # Outside the demo the vault needs its own key (AGENTOPS_SECRET_KEYS): a clear start-up error.
    vault_key = "x" * 43 + "="  # a well-formed Fernet key (32 bytes, url-safe base64)
    real_key = "x" * 20 + "a-real-random-secret-key-for-this-test"
    assert start(DJANGO_DEBUG="1", AGENTOPS_SECRET_KEYS=vault_key).stdout.strip() == "started"
    assert start(DJANGO_SECRET_KEY=real_key, AGENTOPS_SECRET_KEYS=vault_key).stdout.strip() == "started"
    no_vault_key = start(DJANGO_SECRET_KEY=real_key, AGENTOPS_SECRET_KEYS="")
    assert no_vault_key.returncode != 0 and "AGENTOPS_SECRET_KEYS is not set" in no_vault_key.stderr


@pytest.mark.django_db
@pytest.mark.parametrize("password", ["short1", "password123456", "12345678901234", "operator-operator"])
def test_password_validators_refuse_weak_passwords(password: str) -> None:
    user = factories.user("operator-operator")
    with pytest.raises(ValidationError):
        validate_password(password, user)
    validate_password("correct horse battery staple 7", user)


@pytest.mark.django_db
def test_login_is_throttled_after_five_failures_per_username_and_address() -> None:
    factories.user("victim", password="the-right-password-42")
    client = Client()
    for _ in range(4):
        response = client.post("/login/", {"username": "victim", "password": "wrong"})
        assert response.status_code == 200  # the form again, with its error
    assert client.post("/login/", {"username": "victim", "password": "wrong"}).status_code == 429  # the 5th locks
    locked = client.post("/login/", {"username": "victim", "password": "the-right-password-42"})
    assert locked.status_code == 429
    assert "Too many failed logins" in locked.content.decode()
    assert "_auth_user_id" not in client.session
    assert AccessAttempt.objects.get(username="victim").failures_since_start >= 5
    # Another address is not locked out with it: the lockout is per username and address.
    other = Client(REMOTE_ADDR="10.9.8.7")
    assert other.post("/login/", {"username": "victim", "password": "the-right-password-42"}).status_code == 302


@pytest.mark.django_db
def test_a_successful_login_resets_the_failure_count() -> None:
    factories.user("someone", password="the-right-password-42")
    client = Client()
    for _ in range(4):
        client.post("/login/", {"username": "someone", "password": "wrong"})
    assert client.post("/login/", {"username": "someone", "password": "the-right-password-42"}).status_code == 302
    client.logout()
    for _ in range(4):
        assert client.post("/login/", {"username": "someone", "password": "wrong"}).status_code == 200
    assert client.post("/login/", {"username": "someone", "password": "the-right-password-42"}).status_code == 302


@pytest.mark.django_db
def test_api_docs_load_their_assets_from_this_server() -> None:
    client = login(factories.user(groups=["operators"]))
    page = client.get("/api/docs")
    assert page.status_code == 200
    html = page.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources and all(src.startswith("/") for src in sources), sources
    # No URL to another host anywhere in the page (its scripts' settings included). Not a bare
    # "cdn" substring: the page's random CSRF token contained those three letters once in CI.
    assert not re.search(r"(?:https?:)?//(?!127\.0\.0\.1|localhost|testserver)[a-z0-9.-]+", html.lower()), html
    for src in sources:
        if src.startswith("/static/"):
            assert client.get(src).status_code == 200, src


@pytest.mark.django_db
def test_agent_api_key_env_must_be_on_the_allow_list(settings: Any) -> None:
    agent = factories.agent_profile(api_key_env="DATABASE_URL")
    with pytest.raises(ValidationError) as refused:
        agent.full_clean()
    assert "api_key_env" in refused.value.message_dict
    agent.api_key_env = "OPENAI_API_KEY"
    agent.full_clean()
    settings.AGENTOPS_MODEL_KEY_ENVS = ["OPENAI_API_KEY", "DATABASE_URL"]
    agent.api_key_env = "DATABASE_URL"
    agent.full_clean()
