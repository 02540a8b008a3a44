"""Gate and run tool steps.

The gate decides per step: safe_readonly runs; confirm_once runs under a live grant; anything
else asks a reviewer (an ApprovalRequest; the worker is released). Running claims the step
(approved → running) and consumes its approval in the same transaction, so what was approved
runs exactly once.
"""

import hashlib
import logging
import mimetypes
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F

from agentops.domain import Conflict, InvalidTransition, joins_transaction
from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_consume, approval_request_create, grant_is_live
from sessions_app.engine.state import lease_seconds_for, step_claim, step_is_cancelled
from sessions_app.models import AgentProfile, AgentSession, Step
from sessions_app.services import artifact_record, session_lock, step_transition
from tools_app.builtin import BUILTIN_TOOLS, execute_tool, validate_arguments
from tools_app.models import ApprovalMode, ToolDefinition
from tools_app.sandbox import sandbox_status, workspace_for, workspace_manifest
from tools_app.selectors import tool_definitions_by_name

log = logging.getLogger(__name__)


def session_workspace(session: AgentSession) -> Path:
    """The session's workspace, created (and seeded with the profile's starter files) on first use."""
    if session.workspace:
        path = Path(session.workspace)
        if path.is_dir():
            return path
    path = workspace_for(session.id)
    for rel, content in (session.agent.starter_files or {}).items():
        target = (path / rel).resolve()
        if path.resolve() not in target.parents:
            continue  # a starter file must stay inside the workspace
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            _chown_like(target, path)
    AgentSession.objects.filter(pk=session.pk).update(workspace=str(path))
    session.workspace = str(path)
    return path


def _chown_like(target: Path, root: Path) -> None:
    import os

    st = root.stat()
    node = target
    while node != root:
        try:
            os.chown(node, st.st_uid, st.st_gid)
        except PermissionError:
            return
        node = node.parent


def _fail_step(step: Step, code: str, message: str) -> None:
    step_transition(step_id=step.id, to=Step.Status.FAILED, event_type="tool.failed",
                    event_payload={"result": {"status": "failed", "error_code": code, "output": message}},
                    result={"status": "failed", "error_code": code, "output": message},
                    error_code=code, error_message=message)


_allowed_cache: dict[int, tuple[float, frozenset[str]]] = {}


def allowed_tool_names(profile: AgentProfile) -> frozenset[str]:
    """The names of the tools a profile may use, cached as briefly as the tool definitions."""
    cached = _allowed_cache.get(profile.pk)
    if cached and time.monotonic() - cached[0] < 2.0:
        return cached[1]
    names = frozenset(profile.tools.values_list("name", flat=True))
    _allowed_cache[profile.pk] = (time.monotonic(), names)
    return names


def risk_of(tool: ToolDefinition) -> tuple[str, str]:
    if tool.network == "host":
        return "high", "This call may reach the network from the sandbox."
    if tool.name in ("send_email", "http_request"):
        return "high", "This call has an effect outside the workspace."
    if tool.approval_mode == ApprovalMode.CONFIRM_ONCE:
        return "medium", "Confirm-once tool: you may allow it for the rest of the session."
    return "medium", "Changes files in the session's sandboxed workspace."


@joins_transaction
def gate_step(*, step: Step, session: AgentSession) -> str:
    """Decide what a planned tool step needs. Returns the step's new status."""
    tool = tool_definitions_by_name().get(step.tool_name)
    allowed = tool is not None and tool.name in allowed_tool_names(session.agent)
    if step.error_code == "invalid_arguments":
        _fail_step(step, "invalid_arguments", step.error_message)
        return Step.Status.FAILED
    if tool is None or not tool.enabled or not allowed:
        _fail_step(step, "denied" if tool else "unknown_tool",
                   f"The tool {step.tool_name!r} is not available to this agent.")
        return Step.Status.FAILED
    errors = validate_arguments(tool.name, tool.parameters_schema, step.arguments)
    if errors:
        _fail_step(step, "invalid_arguments", "Invalid arguments: " + "; ".join(errors[:10]))
        return Step.Status.FAILED
    if tool.kind == ToolDefinition.Kind.CLIENT:
        # The integration runs it and posts the output by call_id; no lease: nothing runs here.
        step_transition(step_id=step.id, to=Step.Status.RUNNING, event_type="tool.started",
                        event_payload={"client": True, "call_id": step.call_id, "arguments": step.arguments})
        return Step.Status.RUNNING
    mode = tool.approval_mode
    if mode == ApprovalMode.SAFE_READONLY or (
            mode == ApprovalMode.CONFIRM_ONCE and grant_is_live(session_id=session.id, tool_name=tool.name)):
        step_transition(step_id=step.id, to=Step.Status.APPROVED, session_id=step.session_id, known=step)
        return Step.Status.APPROVED
    risk, note = risk_of(tool)
    preview = ""
    if tool.name == "write_file":
        try:
            from tools_app.builtin import write_file_preview

            preview = write_file_preview(session_workspace(session), step.arguments)
        except Exception as exc:  # a preview is a courtesy; the approval must still be asked
            preview = f"(no preview: {exc})"
    status = sandbox_status()
    approval_request_create(step_id=step.id, risk=risk, risk_note=note, preview=preview,
                            sandbox_backend=str(status.get("backend", "")), network_policy=tool.network,
                            ttl_seconds=tool.approval_ttl_seconds)
    return Step.Status.AWAITING_APPROVAL


def needs_sandbox_queue(step: Step) -> bool:
    builtin = BUILTIN_TOOLS.get(step.tool_name)
    return builtin is None or builtin.needs_sandbox


def _approval_for(step: Step) -> ApprovalRequest | None:
    return (ApprovalRequest.objects.filter(step=step, kind=ApprovalRequest.Kind.TOOL,
                                           status=ApprovalRequest.Status.APPROVED).order_by("-created_at").first())


def claim_tool_step(step_id: uuid.UUID | str) -> tuple[Step, ApprovalRequest | None] | None:
    """approved → running with a lease, consuming its approval in the same transaction.

    None when the step is not approved (another worker has it) or the claim loses a race.
    """
    step = Step.objects.filter(pk=step_id, status=Step.Status.APPROVED).first()
    if step is None:
        return None
    with transaction.atomic():
        session_lock(step.session_id)
        try:
            approval = claim_tool_step_locked(step)
        except Conflict:
            # Claimed meanwhile, or its approval consumed already (a previous attempt ran it:
            # never run it twice; the sweeper checks what really happened).
            transaction.set_rollback(True)
            return None
    return step, approval


def claim_tool_step_locked(step: Step) -> ApprovalRequest | None:
    """approved → running for a step of a session this transaction has locked.

    Consumes its approval first (only a step a reviewer was asked about has one); raises
    Conflict when it was consumed already or the step is no longer approved.
    """
    approval = None if step.approval_mode == ApprovalMode.SAFE_READONLY else _approval_for(step)
    if approval is not None:
        approval_consume(request_id=approval.request_id)
    tool = tool_definitions_by_name().get(step.tool_name)
    claimed = step_claim(step_id=step.id, from_status=Step.Status.APPROVED,
                         lease_seconds=lease_seconds_for(tool.timeout_seconds if tool else 60),
                         event_type="tool.started", known=step)
    if claimed is None:
        raise Conflict(f"Step {step.id} is no longer approved", code="claim_lost")
    return approval


def run_tool_step(step_id: uuid.UUID | str) -> Step | None:
    """Claim, run and record one approved tool step. Returns None when another worker has it."""
    claim = claim_tool_step(step_id)
    if claim is None:
        return None
    step, approval = claim
    return run_claimed_tool_step(step, approval)


def run_claimed_tool_step(step: Step, approval: ApprovalRequest | None,
                          session: AgentSession | None = None) -> Step | None:
    """Run a tool step this worker claimed and record its result."""
    session = session or AgentSession.objects.select_related("agent").get(pk=step.session_id)
    tool = tool_definitions_by_name().get(step.tool_name)
    workspace = session_workspace(session)
    manifest = None
    if tool is not None and not tool.idempotent:
        # Effect evidence before a mutating command: recovery compares the workspace with it.
        manifest = workspace_manifest(workspace)
        Step.objects.filter(pk=step.pk).update(manifest=manifest)
    result = execute_tool(name=step.tool_name, workspace=workspace, arguments=step.arguments,
                          timeout_seconds=tool.timeout_seconds if tool else None,
                          network=tool.network if tool else "none",
                          idempotency_key=step.idempotency_key or str(step.id),
                          should_cancel=lambda: step_is_cancelled(step.id), manifest_before=manifest)
    failpoint_after_tool(step.tool_name)
    payload = result.to_dict()
    if approval is not None and approval.edited_arguments is not None:
        payload["reviewer_note"] = ("Note: the reviewer changed the arguments before approving. You asked for "
                                    f"{approval.arguments}; what ran was {approval.edited_arguments}.")
    return record_tool_result(step=step, result=payload, workspace=workspace)


def failpoint_after_tool(tool_name: str) -> None:
    """Fault injection for the recovery tests: ``AGENTOPS_FAILPOINT_AFTER_TOOL=send_email:30`` holds
    the worker for 30 s after the tool's effect and before its result is recorded, the window in
    which a crash leaves the outcome unknown; ``AGENTOPS_FAILPOINT_MARKER=<path>`` is touched when
    it holds, so a test knows when to kill. Unset in production."""
    spec = os.environ.get("AGENTOPS_FAILPOINT_AFTER_TOOL", "")
    name, _, seconds = spec.partition(":")
    if name and name == tool_name:
        log.warning("failpoint: holding %s for %ss after its effect", tool_name, seconds)
        if os.environ.get("AGENTOPS_FAILPOINT_MARKER"):
            Path(os.environ["AGENTOPS_FAILPOINT_MARKER"]).touch()
        time.sleep(float(seconds or 30))


def record_tool_result(*, step: Step, result: dict[str, Any], workspace: Path | None) -> Step | None:
    ok = result.get("status") == "completed"
    artifacts = []
    if workspace is not None:
        for item in result.get("published_files") or []:
            stored = _store_artifact(step.session_id, workspace, item)
            if stored:
                artifacts.append(stored)
    try:
        with transaction.atomic():
            session_lock(step.session_id)
            moved = step_transition(
                step_id=step.id, session_id=step.session_id, known=step,
                to=Step.Status.COMPLETED if ok else Step.Status.FAILED,
                event_type="tool.completed" if ok else "tool.failed",
                event_payload={"result": event_result(result)}, result=result,
                error_code="" if ok else str(result.get("error_code", "tool_error")),
                error_message="" if ok else str(result.get("error_message", ""))[:2000])
            AgentSession.objects.filter(pk=step.session_id).update(tool_calls=F("tool_calls") + 1)
            for item in artifacts:
                artifact_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, **item)
    except InvalidTransition:
        log.info("step %s was settled meanwhile (cancelled?); its result is dropped", step.id)
        return None
    return moved


def event_result(result: dict[str, Any]) -> dict[str, Any]:
    keep = ("status", "output", "exit_code", "duration_ms", "files_changed", "error_code", "error_message",
            "reviewer_note")
    out = {k: result.get(k) for k in keep if k in result}
    text = out.get("output")
    if isinstance(text, str) and len(text) > 8000:
        out["output"] = text[:4000] + "\n[… cut in the live view; the full output is stored …]\n" + text[-4000:]
    return out


def _store_artifact(session_id: uuid.UUID, workspace: Path, item: dict[str, Any]) -> dict[str, Any] | None:
    """Copy a published file out of the workspace, content-addressed, so it outlives it."""
    rel = str(item.get("path", ""))
    source = (workspace / rel).resolve()
    if workspace.resolve() not in source.parents or not source.is_file() or source.is_symlink():
        return None
    digest = hashlib.sha256()
    with source.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    sha = digest.hexdigest()
    target = Path(settings.AGENTOPS_ARTIFACT_ROOT) / str(session_id) / sha
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        shutil.copyfile(source, target)
    return {"path": rel, "size": target.stat().st_size, "sha256": sha, "storage_path": str(target),
            "content_type": mimetypes.guess_type(rel)[0] or "application/octet-stream"}
