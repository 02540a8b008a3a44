"""Retention: the workspace of a session at rest is removed after its TTL while its artifacts stay
downloadable; idempotency records expire; Celery beat and a management command run it."""

import hashlib
import json
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone

from agentops.models import IdempotencyRecord
from approvals_app.services import approval_decide
from sessions_app.engine.commands import session_start, turn_submit
from sessions_app.models import AgentProfile, AgentSession, Artifact, Event, Turn
from sessions_app.retention import retention_sweep
from sessions_app.services import turn_create
from tests import factories
from tests.helpers import WorkerFactory, api_client, finished, pending_approvals, script, tool
from tests.waiting import wait_for

REPORT = "mkdir -p outputs && printf 'quarterly report\\n' > outputs/report.txt && echo scratch > scratch.txt"


def _session_with_an_artifact(agent: AgentProfile, operator: User, reviewer: User) -> tuple[AgentSession, Artifact]:
    session, turn = session_start(agent=agent, owner=operator,
                                  input=script(tool("run_command", command=REPORT), "say {results}"))
    assert turn is not None
    (approval,) = pending_approvals(turn)
    approval_decide(request_id=approval.request_id, actor=reviewer, decision="approve",
                    seen_hash=approval.arguments_sha256)
    assert finished(turn, timeout=60).status == "completed"
    session = AgentSession.objects.get(pk=session.pk)
    assert (Path(session.workspace) / "scratch.txt").exists()
    return session, Artifact.objects.get(session=session, path="outputs/report.txt")


def _download(operator: User, artifact: Artifact) -> Any:
    return api_client(operator).get(f"/api/artifacts/{artifact.id}/content")


@pytest.mark.usefixtures("workers")
def test_retention_removes_a_stale_workspace_and_its_artifacts_stay_downloadable(
        engine_agent: AgentProfile, operator: User, reviewer: User, settings: Any) -> None:
    settings.AGENTOPS_WORKSPACE_TTL_HOURS = 24
    session, artifact = _session_with_an_artifact(engine_agent, operator, reviewer)
    workspace = Path(session.workspace)

    assert retention_sweep()["workspaces_removed"] == 0  # not stale yet
    later = timezone.now() + timedelta(hours=25)
    assert retention_sweep(now=later, dry_run=True)["workspaces_removed"] == 1
    assert workspace.exists()  # a dry run changes nothing
    assert retention_sweep(now=later)["workspaces_removed"] == 1

    assert not workspace.exists()
    assert not any(p.name.startswith(".retired-") for p in workspace.parent.iterdir())
    session.refresh_from_db()
    assert session.workspace == ""
    event = Event.objects.get(session=session, type="workspace.removed")
    assert event.payload == {"reason": "retention", "ttl_hours": 24}
    response = _download(operator, artifact)
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert body == b"quarterly report\n" and hashlib.sha256(body).hexdigest() == artifact.sha256
    assert retention_sweep(now=later)["workspaces_removed"] == 0  # nothing left to remove

    # The session goes on in a fresh workspace.
    turn = turn_submit(session_id=session.id, input=script(tool("list_files", path="."), "say {results}"),
                       actor=operator)
    turn = finished(turn)
    assert turn.status == "completed" and "scratch.txt" not in turn.output_text


@pytest.mark.django_db
def test_retention_leaves_active_and_recent_sessions_alone(operator: User, settings: Any) -> None:
    from sessions_app.engine.tool_steps import session_workspace

    settings.AGENTOPS_WORKSPACE_TTL_HOURS = 1
    busy = factories.session(owner=operator)
    turn_create(session_id=busy.id, input="still running")
    recent = factories.session(owner=operator)
    for session in (busy, recent):
        session_workspace(AgentSession.objects.select_related("agent").get(pk=session.pk))
    assert retention_sweep(now=timezone.now() + timedelta(minutes=30))["workspaces_removed"] == 0
    counts = retention_sweep(now=timezone.now() + timedelta(hours=2))
    assert counts["workspaces_removed"] == 1  # only the one at rest
    assert AgentSession.objects.get(pk=busy.pk).workspace != ""
    assert AgentSession.objects.get(pk=recent.pk).workspace == ""
    assert Turn.objects.get(session=busy).status == "queued"


@pytest.mark.django_db
def test_idempotency_records_expire_after_their_ttl(operator: User, settings: Any) -> None:
    settings.AGENTOPS_IDEMPOTENCY_TTL_HOURS = 24
    session = factories.session(owner=operator)
    api = api_client(operator)
    for key in ("k-old", "k-new"):
        response = api.post(f"/api/sessions/{session.id}/budget", json.dumps({"max_tool_calls": None}),
                            content_type="application/json", headers={"Idempotency-Key": key})
        assert response.status_code == 200
    IdempotencyRecord.objects.filter(key="k-old").update(created_at=timezone.now() - timedelta(hours=25))
    out = StringIO()
    call_command("retention_sweep", "--dry-run", stdout=out)
    assert "would remove 0 workspace(s) and 1 idempotency record(s)" in out.getvalue()
    assert IdempotencyRecord.objects.count() == 2
    call_command("retention_sweep", stdout=out)
    assert "removed 0 workspace(s) and 1 idempotency record(s)" in out.getvalue()
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["k-new"]


def test_retention_beat_job_removes_the_workspace(worker_process: WorkerFactory, engine_agent: AgentProfile,
                                                  operator: User, reviewer: User,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Every worker with a TTL of about 2 s (any of them may run the job beat sends).
    monkeypatch.setenv("AGENTOPS_WORKSPACE_TTL_HOURS", str(2 / 3600))
    monkeypatch.setenv("AGENTOPS_RETENTION_SWEEP_SECONDS", "0.5")
    worker_process(kind="gateway")
    worker_process()
    session, artifact = _session_with_an_artifact(engine_agent, operator, reviewer)
    workspace = Path(session.workspace)
    worker_process(beat=True)  # its retention job runs every half second
    wait_for(lambda: not workspace.exists(), 60, "the beat job to remove the workspace")
    wait_for(lambda: AgentSession.objects.get(pk=session.pk).workspace == "", 10, "the session to forget it")
    assert Event.objects.filter(session=session, type="workspace.removed").count() == 1
    assert _download(operator, artifact).status_code == 200
