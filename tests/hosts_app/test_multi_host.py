"""Two hosted sandbox hosts (two worker processes, separate workspace roots), an engine worker and
a model gateway that cannot open any workspace: sessions pinned to each host, files never cross,
every workspace operation (file tools, commands, the reviewer's write-diff, artifacts, the
manifest check after a crash) runs on the pinned host; moving a session seeds it from artifacts."""

import json
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from approvals_app.models import ApprovalRequest
from hosts_app.models import SessionPlacement
from sessions_app.engine.commands import session_start, turn_submit
from sessions_app.models import Artifact, Event, Step
from tests.helpers import api_client, finished, pending_approvals, script, tool
from tests.hosts_app.conftest import Cluster, zone_agent
from tests.waiting import wait_for
from tools_app.models import ToolDefinition
from tools_app.services import tool_definitions_seed

pytestmark = pytest.mark.django_db(transaction=True)


def approve(reviewer: User, approval: ApprovalRequest) -> None:
    client = Client()
    client.force_login(reviewer)
    response = client.post(f"/api/approvals/{approval.request_id}/decision",
                           json.dumps({"decision": "approve", "arguments_sha256": approval.arguments_sha256}),
                           content_type="application/json")
    assert response.status_code == 200, response.content


def files_named(root: Path, name: str) -> list[Path]:
    return list(root.rglob(name))


def test_two_hosts_pin_sessions_and_files_never_cross(cluster: Cluster, people: tuple[User, User],
                                                      scripted_model_url: str) -> None:
    operator, reviewer = people
    tool_definitions_seed()  # the row must exist before it is changed (a flushed database may have none)
    assert ToolDefinition.objects.filter(name="run_command").update(approval_mode="safe_readonly") == 1
    agent_a, agent_b = zone_agent(scripted_model_url, "zone-a"), zone_agent(scripted_model_url, "zone-b")
    cluster.start_host("ha", "zone-a")
    cluster.start_host("hb", "zone-b")
    cluster.start_engine()
    cluster.wait_online("ha", "hb")

    # Session A (host ha): a reviewed write_file (its diff computed on ha), a command, an artifact.
    session_a, turn_a = session_start(agent=agent_a, owner=operator, input=script(
        tool("write_file", path="secret.txt", content="from-a\n"),
        tool("run_command", command="cat secret.txt && mkdir -p outputs && cp secret.txt outputs/copy.txt"),
        "say {results}"))
    assert turn_a is not None
    (approval,) = pending_approvals(turn_a, timeout=60)
    preview = wait_for(lambda: ApprovalRequest.objects.get(pk=approval.pk).preview or None, 60, "the host's preview")
    assert "+from-a" in preview
    approve(reviewer, approval)
    turn_a = finished(turn_a, timeout=90)
    assert turn_a.status == "completed", (turn_a.error_code, turn_a.error_message)

    # Session B (host hb) looks for A's file with every tool it has.
    session_b, turn_b = session_start(agent=agent_b, owner=operator, input=script(
        tool("read_file", path="secret.txt"),
        tool("run_command", command="ls -a /workspace; cat secret.txt; find / -name secret.txt 2>/dev/null; true"),
        "say {results}"))
    assert turn_b is not None
    turn_b = finished(turn_b, timeout=90)
    assert turn_b.status == "completed", (turn_b.error_code, turn_b.error_message)

    assert SessionPlacement.objects.get(session=session_a).host.name == "ha"
    assert SessionPlacement.objects.get(session=session_b).host.name == "hb"
    assert Event.objects.filter(session=session_a, type="session.pinned", payload__host="ha").exists()
    read, run = Step.objects.filter(turn=turn_b, kind="tool").order_by("index")
    assert read.status == "failed" and "from-a" not in json.dumps(read.result)
    assert run.status == "completed" and "from-a" not in json.dumps(run.result)
    # The files live on host ha only; the engine's and the gateway's root was never created.
    assert (cluster.root("ha") / str(session_a.id) / "secret.txt").read_text() == "from-a\n"
    assert files_named(cluster.root("hb"), "secret.txt") == []
    assert not (cluster.root("hb") / str(session_a.id)).exists()
    assert not (cluster.root("ha") / str(session_b.id)).exists()
    assert (cluster.base / "engine-cannot-open").is_file()
    # The artifact was uploaded to central storage by ha; its download needs no host.
    (artifact,) = Artifact.objects.filter(session=session_a)
    assert (Path(settings.AGENTOPS_ARTIFACT_ROOT) / artifact.storage_path).read_bytes() == b"from-a\n"

    # The hosts list shows both, online.
    hosts = {h["name"]: h for h in api_client(operator).get("/api/hosts").json()}
    assert hosts["ha"]["status"] == hosts["hb"]["status"] == "online"
    assert hosts["ha"]["self_test"]["ok"] is True

    # Move session A to hb: a new workspace there, seeded from its artifacts; the next turn runs on hb.
    response = api_client(operator).post(f"/api/sessions/{session_a.id}/host", {"host": "hb"},
                                         content_type="application/json")
    assert response.status_code == 200 and response.json()["host"] == "hb", response.content
    seeded = cluster.root("hb") / str(session_a.id) / "outputs" / "copy.txt"
    wait_for(lambda: seeded.exists() or None, 60, "the seeded workspace on hb")
    assert Event.objects.filter(session=session_a, type="session.moved", payload__to="hb").exists()
    turn = turn_submit(session_id=session_a.id, input=script(
        tool("run_command", command="cat outputs/copy.txt; test ! -e secret.txt && echo no-secret"), "say {results}"))
    turn = finished(turn, timeout=90)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    (step,) = Step.objects.filter(turn=turn, kind="tool")
    output = (step.result or {})["output"]
    assert "from-a" in output and "no-secret" in output


def test_host_killed_mid_command_waits_then_checks_its_manifest_when_back(
        cluster: Cluster, people: tuple[User, User], scripted_model_url: str) -> None:
    operator, _ = people
    tool_definitions_seed()  # the row must exist before it is changed (a flushed database may have none)
    changed = ToolDefinition.objects.filter(name="run_command").update(approval_mode="safe_readonly",
                                                                       timeout_seconds=4, max_attempts=3)
    assert changed == 1
    agent = zone_agent(scripted_model_url, "zone-a")
    cluster.start_host("ha", "zone-a")
    cluster.start_engine()
    cluster.wait_online("ha")
    session, turn = session_start(agent=agent, owner=operator, input=script(
        tool("run_command", command="echo changed > changed.txt; sleep 3"), "say {results}"))
    assert turn is not None
    marker = cluster.root("ha") / str(session.id) / "changed.txt"
    wait_for(lambda: marker.exists() or None, 90, "the command to start on ha")
    cluster.kill("ha")  # SIGKILL, mid-command

    step = Step.objects.get(turn=turn, kind="tool")
    wait_for(lambda: Event.objects.filter(step=step, type="host.waiting").exists() or None, 60,
             "the step to wait for its host")
    assert Step.objects.get(pk=step.pk).status == "running"  # not retried blindly, not decided without ha
    cluster.start_host("ha", "zone-a")
    wait_for(lambda: Step.objects.get(pk=step.pk).status == "in_doubt" or None, 90, "the manifest check on ha")
    assert Event.objects.filter(step=step, type="host.manifest_check", payload__host="ha").exists()
    assert Event.objects.filter(step=step, type="step.recovered", payload__checked_on_host=True,
                                payload__outcome="in_doubt").exists()
    assert ApprovalRequest.objects.filter(step=step, kind="recovery", status="pending").exists()
    assert (cluster.base / "engine-cannot-open").is_file()
