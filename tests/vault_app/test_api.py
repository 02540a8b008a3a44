"""The vault's API: values are write-only (no response holds one), team-scoped reads, and bad
input refused with nothing changed (403, 404, 409, 413, 422)."""

import json

import pytest
from django.contrib.auth.models import User

from tests import factories
from tests.helpers import api_client
from vault_app import crypto
from vault_app.models import Secret

VALUE = "tok-8f3a91c2d4e5b6a7"


@pytest.fixture
def admin(db: None) -> User:
    return factories.user("vault-admin", is_superuser=True, is_staff=True, teams=[])


def _post(client, body):  # type: ignore[no-untyped-def]
    return client.post("/api/secrets", json.dumps(body), content_type="application/json")


def test_secret_create_api_is_write_only(admin: User) -> None:
    factories.team("ops")
    client = api_client(admin)
    response = _post(client, {"team": "ops", "name": "status_token", "value": VALUE,
                              "allowed_tools": ["http_request", "run_command"]})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "status_token" and "value" not in body and "ciphertext" not in body
    assert VALUE not in response.content.decode()
    secret = Secret.objects.get(pk=body["id"])
    assert crypto.decrypt(secret.ciphertext) == VALUE
    for url in ("/api/secrets", f"/api/secrets/{secret.pk}"):
        read = client.get(url)
        assert read.status_code == 200 and VALUE not in read.content.decode()
    patched = client.patch(f"/api/secrets/{secret.pk}", json.dumps({"value": VALUE + "-v2"}),
                           content_type="application/json")
    assert patched.status_code == 200 and VALUE not in patched.content.decode()
    assert crypto.decrypt(Secret.objects.get(pk=secret.pk).ciphertext) == VALUE + "-v2"
    assert client.delete(f"/api/secrets/{secret.pk}").status_code == 204
    assert not Secret.objects.exists()


def test_secret_api_refuses_bad_input_and_changes_nothing(admin: User) -> None:
    factories.team("ops")
    client = api_client(admin)
    assert _post(client, {"team": "ops", "name": "tok", "value": VALUE}).status_code == 201
    before = list(Secret.objects.values_list("name", "ciphertext"))
    member = factories.user("mo", groups=["operators"], teams=["ops"])
    cases = [
        (api_client(member), {"team": "ops", "name": "x1", "value": VALUE}, 403),
        (client, {"team": "ops", "name": "tok", "value": VALUE}, 409),
        (client, {"team": "ops", "name": "big", "value": "v" * 20_000}, 413),
        (client, {"team": "ops", "name": "Bad Name!", "value": VALUE}, 422),
        (client, {"team": "ops", "name": "short", "value": "abc"}, 422),
        (client, {"team": "nope", "name": "x2", "value": VALUE}, 404),
        (client, {"team": "ops", "name": "x3"}, 422),
    ]
    for who, body, status in cases:
        response = _post(who, body)
        assert response.status_code == status, (body, response.content)
        assert set(response.json()) == {"code", "message", "details"}
    assert client.get("/api/secrets/00000000-0000-0000-0000-000000000000").status_code == 404
    assert client.get("/api/secrets/not-a-uuid").status_code == 404
    outsider = factories.user("oo", groups=["operators"], teams=["elsewhere"])
    secret = Secret.objects.get()
    assert api_client(outsider).get(f"/api/secrets/{secret.pk}").status_code == 404
    assert api_client(outsider).get("/api/secrets").json()["items"] == []
    assert list(Secret.objects.values_list("name", "ciphertext")) == before


def test_secrets_list_api_queries(admin: User, django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    team = factories.team("ops")
    for n in range(5):
        Secret.objects.create(team=team, name=f"s{n}", ciphertext=crypto.encrypt(VALUE))
    client = api_client(admin)
    with django_assert_num_queries(2):  # the token, the page (team and author joined)
        response = client.get("/api/secrets?limit=3")
    assert len(response.json()["items"]) == 3


def test_admin_form_creates_and_replaces_the_value_write_only(admin: User) -> None:
    from django.test import Client

    team = factories.team("ops")
    client = Client()
    client.force_login(admin)
    response = client.post("/admin/vault_app/secret/add/", {
        "team": team.pk, "name": "db_password", "description": "", "allowed_tools": '["run_command"]',
        "expires_at_0": "", "expires_at_1": "", "value": VALUE})
    assert response.status_code == 302, response.content.decode()[:2000]
    secret = Secret.objects.get(name="db_password")
    assert crypto.decrypt(secret.ciphertext) == VALUE and secret.created_by == admin
    change = client.get(f"/admin/vault_app/secret/{secret.pk}/change/").content.decode()
    assert VALUE not in change and secret.ciphertext not in change
    kept = client.post(f"/admin/vault_app/secret/{secret.pk}/change/", {
        "description": "rotated", "allowed_tools": '["run_command"]', "expires_at_0": "", "expires_at_1": "",
        "value": ""})
    assert kept.status_code == 302
    secret.refresh_from_db()
    assert secret.description == "rotated" and crypto.decrypt(secret.ciphertext) == VALUE  # empty keeps it
