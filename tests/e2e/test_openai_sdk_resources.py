# mypy: disable-error-code="union-attr, index, arg-type, typeddict-item"
"""Conformance, the peripheral half: the official openai SDK's subagents, vaults/credentials and
environments endpoints against agentops's child sessions, secrets vault and sandbox hosts (live
daphne, a Celery worker, the model gateway, the scripted model)."""

import uuid

import httpx
import openai
import pytest
from django.contrib.auth.models import Permission
from openai import OpenAI

from fanout_app.models import SubagentLink
from fanout_app.services import spawn_tool_seed
from hosts_app.models import SandboxHost
from tests.e2e.conftest import Stack, World
from tests.e2e.test_openai_sdk import _client, _until_idle, sdk  # noqa: F401 - the SDK fixture
from tests.helpers import api_token, script, tool
from vault_app.crypto import decrypt
from vault_app.models import Secret

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VALUE = "tok-0123456789-abcdef"


def test_a_subagent_is_visible_through_the_subagents_endpoints(sdk: OpenAI, world: World,  # noqa: F811
                                                               stack: Stack) -> None:
    """A spawn_subagents call starts a child session; the SDK lists and reads it as a subagent
    (its turns and items too), and agentops's own API shows the same child."""
    world.agent.tools.add(spawn_tool_seed())
    nested = [{"instructions": "Check seat 12B.", "input": "say seat 12B is free"}]
    tasks = [{"instructions": "Check seat 12A.",
              "input": script(tool("spawn_subagents", tasks=nested), "say seat 12A is free")}]
    stream = sdk.beta.agents.sessions.create(
        environment={"type": "self_hosted", "workspace_directory": "/workspace"}, agent_id=world.agent.slug,
        stream=True, input=script(tool("spawn_subagents", tasks=tasks), "say children done"))
    events = _until_idle(stream)
    assert events[-1].type == "agent.session.idle"
    # The call is the wire's multi-agent items: the child created, waited for, its answer back.
    items = [e.item for e in events if e.type in ("agent.session.turn.item.added", "agent.session.turn.item.done")]
    created = [i for i in items if i.type == "create_subagent_call"]
    assert created and created[0].agent_id == world.agent.slug and created[0].content[0].text == "Check seat 12A."
    waits = [i for i in items if i.type == "wait_for_subagents_call"]
    assert [w.status for w in waits] == ["in_progress", "completed"]
    answers = [i for i in items if i.type == "agent_message"]
    assert len(answers) == 1 and "seat 12A is free" in answers[0].content[0].text
    opened = [e.subagent for e in events if e.type == "agent.session.subagent.created"]
    closed = [e.subagent for e in events if e.type == "agent.session.subagent.closed"]
    assert [(s.status, s.parent_agent_id) for s in opened] == [("active", world.agent.slug)]
    assert [(s.id, s.status) for s in closed] == [(opened[0].id, "closed")]
    session_id = events[0].session.id
    # The child's turn goes through the root's stream too, with its subagent id, ended before it closed.
    child_turns = [(e.type, e.turn.subagent_id, e.turn.session_id, e.turn.status) for e in events
                   if e.type.startswith("agent.session.turn.") and getattr(e, "turn", None) is not None
                   and e.turn.subagent_id is not None]
    assert child_turns == [("agent.session.turn.created", opened[0].id, session_id, "queued"),
                           ("agent.session.turn.completed", opened[0].id, session_id, "completed")]
    kinds = [e.type for e in events]
    assert kinds.index("agent.session.subagent.closed") > max(
        i for i, e in enumerate(events) if e.type == "agent.session.turn.completed" and e.turn.subagent_id)
    child_id = str(SubagentLink.objects.get(parent_id=session_id).child_id)

    assert waits[0].recipient_agent_ids == [child_id]
    grandchild_id = str(SubagentLink.objects.get(parent_id=uuid.UUID(child_id)).child_id)

    subagents = list(sdk.beta.agents.sessions.subagents.list(session_id, order="asc"))
    assert [s.id for s in subagents] == [child_id, grandchild_id]
    # The grandchild, through the root's endpoints: its parent is the child; its turn and items are there.
    grand = sdk.beta.agents.sessions.subagents.retrieve(grandchild_id, session_id=session_id)
    assert grand.parent_agent_id == child_id and grand.status == "closed"
    grand_turns = list(sdk.beta.agents.sessions.subagents.turns.list(grandchild_id, session_id=session_id))
    assert [(t.status, t.subagent_id) for t in grand_turns] == [("completed", grandchild_id)]
    grand_items = list(sdk.beta.agents.sessions.subagents.items.list(grandchild_id, session_id=session_id,
                                                                     order="asc"))
    assert grand_items[-1].content[0].text == "seat 12B is free"
    child_calls = [i.type for i in sdk.beta.agents.sessions.subagents.items.list(child_id, session_id=session_id)]
    assert "create_subagent_call" in child_calls and "agent_message" in child_calls
    root_turn = next(e.turn_id for e in events if e.type == "agent.session.turn.created")
    parent_items = list(sdk.beta.agents.sessions.turns.items.list(root_turn, session_id=session_id, order="asc"))
    assert [i.type for i in parent_items if i.type != "message"] == [
        "create_subagent_call", "wait_for_subagents_call", "agent_message"]
    sub = subagents[0]
    assert sub.object == "agent.session.subagent" and sub.session_id == session_id
    assert sub.parent_agent_id == world.agent.slug and sub.status == "closed" and sub.closed_at is not None
    assert sub.instructions[0].text == "Check seat 12A."
    assert sdk.beta.agents.sessions.subagents.retrieve(child_id, session_id=session_id).id == child_id

    turns = list(sdk.beta.agents.sessions.subagents.turns.list(child_id, session_id=session_id))
    assert [(t.status, t.subagent_id, t.session_id) for t in turns] == [("completed", child_id, session_id)]
    turn = sdk.beta.agents.sessions.subagents.turns.retrieve(turns[0].id, session_id=session_id,
                                                             subagent_id=child_id)
    assert turn.id == turns[0].id
    items = list(sdk.beta.agents.sessions.subagents.turns.items.list(turns[0].id, session_id=session_id,
                                                                     subagent_id=child_id, order="asc"))
    assert items[0].role == "user" and items[-1].content[0].text == "seat 12A is free"
    all_items = list(sdk.beta.agents.sessions.subagents.items.list(child_id, session_id=session_id, order="asc"))
    assert [i.id for i in all_items] == [i.id for i in items]
    with pytest.raises(openai.NotFoundError):
        sdk.beta.agents.sessions.subagents.retrieve(session_id, session_id=session_id)  # not its own child

    own = httpx.get(f"{stack.url}/api/sessions/{session_id}/subagents",
                    headers={"Authorization": f"Bearer {api_token(world.operator)}"})
    assert [c["session_id"] for c in own.json()["children"]] == [child_id]


def test_credentials_go_into_the_team_vault_and_never_come_back(world: World, stack: Stack) -> None:
    world.operator.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="vault_app", codename__in=["add_secret", "change_secret", "delete_secret"]))
    client = _client(stack, api_token(world.operator), max_retries=0)
    team = world.agent.team.slug
    vaults = list(client.beta.agents.vaults.list())
    assert [v.id for v in vaults] == [team] and vaults[0].object == "vault"
    assert client.beta.agents.vaults.retrieve(team).name == world.agent.team.name

    created = client.beta.agents.vaults.credentials.create(
        team, name="tracker_token", metadata={"allowed_tools": "http_request, tracker__*"},
        auth={"type": "environment_variable", "secret_name": "tracker_token", "secret_value": VALUE})
    assert created.object == "vault.credential" and created.vault_id == team and created.auth.secret_name == \
        "tracker_token"
    secret = Secret.objects.get(pk=created.id)
    assert secret.allowed_tools == ["http_request", "tracker__*"] and decrypt(secret.ciphertext) == VALUE
    listed = client.beta.agents.vaults.credentials.list(team)
    assert [c.id for c in listed] == [created.id]
    retrieved = client.beta.agents.vaults.credentials.retrieve(created.id, vault_id=team)
    for answer in (created, retrieved, listed.data[0]):
        assert VALUE not in answer.model_dump_json()  # write-only: never read back
    raw = client.with_raw_response.beta.agents.vaults.credentials.list(team)
    assert VALUE not in raw.http_response.text

    rotated = client.beta.agents.vaults.credentials.update(
        created.id, vault_id=team, auth={"type": "environment_variable", "secret_value": VALUE[::-1]})
    assert VALUE[::-1] not in rotated.model_dump_json()
    assert decrypt(Secret.objects.get(pk=created.id).ciphertext) == VALUE[::-1]

    with pytest.raises(openai.BadRequestError) as refused:
        client.beta.agents.vaults.credentials.create(team, name="oauth", auth={
            "type": "static_bearer", "mcp_server_url": "https://mcp.example", "token": VALUE})
    assert refused.value.body["code"] == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError):
        client.beta.agents.vaults.create(name="another")
    with pytest.raises(openai.PermissionDeniedError):  # the vault_app permission, as in agentops's own API
        _client(stack, api_token(world.reviewer), max_retries=0).beta.agents.vaults.credentials.create(
            team, name="nope", auth={"type": "environment_variable", "secret_value": VALUE})
    assert client.beta.agents.vaults.credentials.delete(created.id, vault_id=team).deleted
    assert not Secret.objects.exists()
    client.close()


def test_a_self_hosted_environment_is_a_runner_and_hosted_ones_are_refused(world: World, stack: Stack) -> None:
    client = _client(stack, api_token(world.operator), max_retries=0)
    SandboxHost.objects.create(name="shared-1", kind="hosted", status="online", pool="default")
    created = client.beta.agents.environments.create(
        environment={"type": "self_hosted", "workspace_directory": "/workspace"},
        extra_body={"agentops_runner": {"name": "acme-laptop", "pool": "acme", "labels": ["gpu"]}})
    assert created.type == "self_hosted" and created.id == "acme-laptop" and created.status == "disconnected"
    token = created.model_extra["agentops_runner_token"]
    host = SandboxHost.objects.get(name="acme-laptop")
    assert host.kind == "runner" and host.pool == "acme" and host.team_id == world.agent.team_id and token
    assert {e.id for e in client.beta.agents.environments.list()} == {"acme-laptop", "shared-1"}
    again = client.beta.agents.environments.retrieve("acme-laptop")
    assert again.status == "disconnected" and "agentops_runner_token" not in again.model_dump()

    for environment in ({"type": "openai_hosted", "container_size": "small"}, {"type": "none"}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.beta.agents.environments.create(environment=environment)
        assert refused.value.body["code"] == "unsupported_feature"
        assert refused.value.body["param"] == "environment.type"
    with pytest.raises(openai.BadRequestError):
        client.beta.agents.environments.templates.create(name="python")
    with pytest.raises(openai.ConflictError):
        client.beta.agents.environments.create(environment={"type": "self_hosted"},
                                               extra_body={"agentops_runner": {"name": "acme-laptop"}})
    assert SandboxHost.objects.count() == 2
    client.close()
