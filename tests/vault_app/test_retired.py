"""A secret's value that was replaced or deleted stays redacted (for AGENTOPS_SECRET_RETIRED_REDACT_DAYS):
a file a command wrote while it was live is read back later by an inline read-only tool, and a
rotated credential often still works."""

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from sessions_app.engine.commands import session_start, turn_submit
from sessions_app.models import AgentProfile, Event, Step, Turn
from tests import factories
from tests.helpers import api_client, finished, pending_approvals, script, tool
from tests.vault_app.test_leak import _approve
from tools_app.models import ToolDefinition
from tools_app.selectors import tool_definitions_cache_clear
from vault_app.models import RetiredSecretValue, Secret
from vault_app.resolve import team_redactor
from vault_app.services import secret_create, secret_delete, secret_update

OLD, NEW = "Old_Value_1111aaaa2222bbbb", "New_Value_3333cccc4444dddd"


@pytest.fixture
def admin(db: None) -> User:
    return factories.user("vault-admin", is_superuser=True, is_staff=True, teams=[])


def _stored_text(session_id: Any) -> str:
    """Everything stored for the session that the operator's API and the model get: steps, events, turns."""
    rows = [*Step.objects.filter(session_id=session_id).values_list("result", "error_message", "arguments"),
            *Event.objects.filter(session_id=session_id).values_list("payload"),
            *Turn.objects.filter(session_id=session_id).values_list("output_text", "error_message")]
    return json.dumps(rows, default=str)


@pytest.mark.usefixtures("workers")
def test_rotated_and_deleted_values_stay_redacted_when_a_file_is_read_back(
        engine_agent: AgentProfile, scripted_model: Any) -> None:
    admin = factories.user("vadmin", is_superuser=True, is_staff=True, teams=[])
    operator = factories.user("oscar", groups=["operators"])
    reviewer = factories.user("rita", groups=["reviewers"])
    ToolDefinition.objects.filter(name="run_command").update(env={"API_KEY": "{{secret:api_key}}"})
    tool_definitions_cache_clear()
    secret = secret_create(actor=admin, team_id=engine_agent.team_id, name="api_key", value=OLD,
                           allowed_tools=["run_command"])
    # An approved command writes the value into the workspace while it is live.
    session, turn = session_start(agent=engine_agent, owner=operator, input=script(
        tool("run_command", command='echo "$API_KEY" > old.txt'), "Saved."))
    assert turn is not None
    (approval,) = pending_approvals(turn)
    _approve(reviewer, approval)
    assert finished(turn, timeout=60).status == "completed"

    # Rotated through the API; then read_file (safe_readonly: inline, nobody reviews it) reads the file.
    client = api_client(admin)
    patched = client.patch(f"/api/secrets/{secret.pk}", json.dumps({"value": NEW}), content_type="application/json")
    assert patched.status_code == 200, patched.content
    turn = turn_submit(session_id=session.id, actor=operator, input=script(
        tool("read_file", path="old.txt"), tool("run_command", command='echo "$API_KEY" > new.txt'), "Read."))
    (approval,) = pending_approvals(turn)
    read = Step.objects.get(turn=turn, tool_name="read_file").result or {}
    print("\nread_file after rotation:", json.dumps(read["output"]))
    assert read["output"].strip() == "[secret:api_key]"
    _approve(reviewer, approval)
    assert finished(turn, timeout=60).status == "completed"

    # Deleted: the value it had is still redacted.
    assert client.delete(f"/api/secrets/{secret.pk}").status_code == 204
    turn = turn_submit(session_id=session.id, actor=operator, input=script(
        tool("read_file", path="new.txt"), tool("read_file", path="old.txt"), "Done."))
    assert finished(turn, timeout=60).status == "completed"
    steps = Step.objects.filter(turn=turn, kind="tool").order_by("index")
    outputs = [(step.result or {})["output"].strip() for step in steps]
    print("read_file after deletion:", outputs)
    assert outputs == ["[secret:api_key]", "[secret:api_key]"]

    stored = _stored_text(session.id) + json.dumps([e.as_json() for e in scripted_model.request_log.entries()])
    assert OLD not in stored and NEW not in stored
    assert RetiredSecretValue.objects.filter(team_id=engine_agent.team_id, name="api_key").count() == 2
    with connection.cursor() as cursor:  # kept encrypted, like the vault's values
        cursor.execute("SELECT ciphertext FROM vault_app_retiredsecretvalue")
        assert all(OLD not in token and NEW not in token for (token,) in cursor.fetchall())


def test_retired_values_are_redacted_for_the_retention_period_only(settings, admin: User) -> None:  # type: ignore[no-untyped-def]
    settings.AGENTOPS_SECRET_RETIRED_REDACT_DAYS = 30
    team = factories.team("ops")
    secret = secret_create(actor=admin, team_id=team.pk, name="api_key", value=OLD, allowed_tools=[])
    secret_update(actor=admin, secret_id=secret.pk, value=OLD)  # the same value: nothing is retired
    assert not RetiredSecretValue.objects.exists()
    secret_update(actor=admin, secret_id=secret.pk, value=NEW)
    redactor = team_redactor(team.pk)
    assert redactor.text(f"a {OLD} b {NEW} c") == "a [secret:api_key] b [secret:api_key] c"
    assert team_redactor(factories.team("other").pk).text(OLD) == OLD  # another team's, not this one's
    RetiredSecretValue.objects.update(retired_at=timezone.now() - timedelta(days=31))
    assert team_redactor(team.pk).text(OLD) == OLD  # past the retention period
    secret_delete(actor=admin, secret_id=secret.pk)  # retires NEW, drops the expired OLD
    assert list(RetiredSecretValue.objects.values_list("name", flat=True)) == ["api_key"]
    assert team_redactor(team.pk).text(f"{OLD} {NEW}") == f"{OLD} [secret:api_key]"
    assert not Secret.objects.exists()


def test_vault_rotate_reencrypts_retired_values(settings, admin: User) -> None:  # type: ignore[no-untyped-def]
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.AGENTOPS_SECRET_KEYS = [old_key]
    team = factories.team("ops")
    secret = secret_create(actor=admin, team_id=team.pk, name="api_key", value=OLD, allowed_tools=[])
    secret_update(actor=admin, secret_id=secret.pk, value=NEW)
    settings.AGENTOPS_SECRET_KEYS = [new_key, old_key]
    call_command("vault_rotate", stdout=(out := io.StringIO()))
    assert "1 secret(s) re-encrypted" in out.getvalue() and "1 retired value(s)" in out.getvalue()
    settings.AGENTOPS_SECRET_KEYS = [new_key]  # the old key is dropped: the retired value still opens
    assert team_redactor(team.pk).text(f"{OLD} {NEW}") == "[secret:api_key] [secret:api_key]"
