"""Work that runs ON a sandbox host (its queue ``sandbox.<name>``): the only code besides the
tool run itself that opens a workspace. Previews for reviewers, manifest checks after a crash,
and seeding a moved session's new workspace from its artifacts."""

import logging
import os
import uuid

from django.core.files.storage import storages
from django.db import transaction

from agentops import dispatch
from approvals_app.models import ApprovalRequest
from hosts_app.services import CHECKING
from sessions_app.engine.recovery import _back_to, _in_doubt
from sessions_app.engine.tool_steps import session_workspace
from sessions_app.events import event_record
from sessions_app.locks import session_lock
from sessions_app.models import AgentSession, Artifact, Step
from tools_app.builtin import write_file_preview
from tools_app.sandbox import PathDenied, open_beneath, workspace_changed_since, workspace_relpath

log = logging.getLogger(__name__)


def step_preview_compute(step_id: uuid.UUID | str) -> None:
    """The write-diff a reviewer sees, computed where the workspace is; attached to the pending
    request (a request decided meanwhile keeps what it had)."""
    step = Step.objects.select_related("session__agent").filter(pk=step_id).first()
    if step is None:
        return
    try:
        preview = write_file_preview(session_workspace(step.session), step.arguments)
    except Exception as exc:  # a preview is a courtesy; the approval stands without it
        preview = f"(no preview: {exc})"
    ApprovalRequest.objects.filter(step_id=step.id, status=ApprovalRequest.Status.PENDING,
                                   preview="").update(preview=preview)


def step_manifest_check(step_id: uuid.UUID | str) -> str:
    """The interrupted step's workspace compared with the manifest taken before it started:
    unchanged → approved again (safe retry); changed → in doubt, a reviewer decides."""
    session_id = Step.objects.filter(pk=step_id).values_list("session_id", flat=True).first()
    if session_id is None:
        return "gone"
    with transaction.atomic():
        session_lock(session_id)
        step = Step.objects.select_for_update().select_related("session").get(pk=step_id)
        if step.status != Step.Status.RUNNING or not step.lease_owner.startswith(CHECKING):
            return "settled"
        workspace = step.session.workspace
        unchanged = step.manifest is not None and bool(workspace) and not workspace_changed_since(
            workspace, step.manifest)
        if unchanged:
            _back_to(step, Step.Status.APPROVED)
            outcome = "retry"
        else:
            outcome = _in_doubt(step, "The sandbox host came back: the workspace changed since the command "
                                      "started (or nothing was known of it). A reviewer decides.")
        event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="step.recovered",
                     payload={"kind": step.kind, "tool": step.tool_name, "attempts": step.attempts,
                              "outcome": outcome, "checked_on_host": True})
        dispatch.tick_enqueue(step.turn_id)
    return outcome


def workspace_seed(session_id: uuid.UUID | str) -> int:
    """A moved session's new workspace: the agent's starter files, then its artifacts (the latest
    content of each path) from central storage. Returns how many files were written."""
    session = AgentSession.objects.select_related("agent").get(pk=session_id)
    workspace = session_workspace(session)
    storage = storages["artifacts"]
    written = 0
    latest: dict[str, Artifact] = {}
    for artifact in Artifact.objects.filter(session=session).order_by("created_at"):
        latest[artifact.path] = artifact
    for rel, artifact in latest.items():
        try:
            fd = open_beneath(workspace, workspace_relpath(rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644,
                              create_parents=True)
        except (PathDenied, OSError, ValueError):
            log.warning("artifact %s of session %s not seeded", rel, session_id)
            continue
        with os.fdopen(fd, "wb") as out, storage.open(artifact.storage_path, "rb") as source:
            for chunk in iter(lambda: source.read(1 << 20), b""):
                out.write(chunk)
        written += 1
    event_record(session_id=session.pk, type="workspace.seeded", payload={"files": written, "from": "artifacts"})
    return written
