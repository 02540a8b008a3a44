"""Tool steps: the gate, the claim, the run and the record.

The gate decides per planned step: ``safe_readonly`` runs; ``confirm_once`` runs under a live
grant; anything else asks a reviewer (an ApprovalRequest; the worker is released). The claim moves
the step approved → running with a lease and consumes its approval in the same transaction, so
what was approved runs exactly once. The run happens outside any transaction; the record is a
second short one.

Kept whole (~490 lines): gate, claim, run and record share the step's private checks (the run
spec's hash, the secret references, the lease) and are read top to bottom as one path; the other
tool sources (MCP runners, engine tools, sandbox hosts) plug in through hooks and live apart.
"""

import hashlib
import logging
import mimetypes
import os
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files import File
from django.core.files.storage import storages
from django.db import transaction
from django.db.models import F

from agentops import dispatch
from agentops.domain import Conflict, InvalidTransition, joins_transaction
from approvals_app.grants import grant_use
from approvals_app.models import ApprovalRequest
from approvals_app.policies import ResolvedPolicy, approval_policy_resolve
from approvals_app.selectors import approval_approved_for_step
from approvals_app.services import (
    RunSpecChanged,
    approval_consume,
    approval_request_create,
    approval_transition,
)
from sessions_app import hooks
from sessions_app.engine.hosting import hooks as hosting
from sessions_app.events import event_record
from sessions_app.locks import session_lock
from sessions_app.models import AgentSession, Step
from sessions_app.services import (
    artifact_record,
    lease_seconds_for,
    step_claim,
    step_result_dropped,
    step_transition,
)
from tools_app.binding import run_spec, spec_differences, spec_sha256, with_arguments
from tools_app.builtin import (
    BUILTIN_TOOLS,
    SECRET_ARGUMENT_FIELDS,
    SECRET_ARGUMENT_REFUSALS,
    execute_tool,
    validate_arguments,
    write_file_preview,
)
from tools_app.models import ApprovalMode, ToolDefinition
from tools_app.runners import ToolRun, tool_runner
from tools_app.sandbox import (
    OutputBatcher,
    PathDenied,
    open_beneath,
    sandbox_status,
    workspace_for,
    workspace_manifest,
    workspace_relpath,
)
from tools_app.secret_refs import Redactor
from tools_app.selectors import tool_definition_get, tool_definitions_by_name, tool_names_of_agent
from vault_app.resolve import (
    SecretRefused,
    call_secret_inputs,
    secret_refusal_result,
    secrets_check,
    secrets_resolve,
)

log = logging.getLogger(__name__)


def session_workspace(session: AgentSession, *, persist: bool = True) -> Path:
    """The session's workspace, created (and seeded with the profile's starter files) on first use.
    ``persist=False``: its path is not stored here; the caller's next write stores it (the inline
    path's one-statement record)."""
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
    if persist:
        AgentSession.objects.filter(pk=session.pk).update(workspace=str(path))
    session.workspace = str(path)
    return path


def _chown_like(target: Path, root: Path) -> None:
    st = root.stat()
    node = target
    while node != root:
        try:
            os.chown(node, st.st_uid, st.st_gid)
        except PermissionError:
            return
        node = node.parent


def runs_in_process(tool_name: str) -> bool:
    """A built-in that needs no sandbox queue: the engine's worker runs it (``list_files``, …)."""
    builtin = BUILTIN_TOOLS.get(tool_name)
    return builtin is not None and not builtin.needs_sandbox


def tool_available(session: AgentSession, tool_name: str) -> ToolDefinition | None:
    """The tool's definition when this session's agent may use it now (enabled and selected)."""
    tool = tool_definitions_by_name().get(tool_name) or tool_definition_get(tool_name)  # new since the cache
    if tool is None or not tool.enabled or tool_name not in tool_names_of_agent(session.agent_id):
        return None
    subset = (session.metadata or {}).get("agentops_tools")  # a subagent's tool subset (fanout_app)
    if isinstance(subset, list) and tool_name not in subset:
        return None
    return tool


def tool_risk(tool: ToolDefinition) -> tuple[str, str]:
    """The risk shown to the reviewer, and why."""
    if tool.kind == ToolDefinition.Kind.MCP:
        return "high", "This call goes to an MCP server: its effect is outside agentops's sandbox and workspace."
    if tool.network == "host":
        return "high", "This call may reach the network from the sandbox."
    if tool.name in ("send_email", "http_request"):
        return "high", "This call has an effect outside the workspace."
    if tool.approval_mode == ApprovalMode.CONFIRM_ONCE:
        return "medium", "Confirm-once tool: you may allow it for the rest of the session."
    return "medium", "Changes files in the session's sandboxed workspace."


def _fail(step: Step, code: str, message: str) -> None:
    result = {"status": "failed", "error_code": code, "output": message}
    step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.FAILED, event_type="tool.failed",
                    event_payload={"result": result}, result=result, error_code=code, error_message=message)


@joins_transaction
def tool_step_gate(*, step: Step, session: AgentSession) -> str:
    """Decide what a planned tool step needs and move it there. Returns its new status."""
    if step.error_code == "invalid_arguments":
        _fail(step, "invalid_arguments", step.error_message)
        return Step.Status.FAILED
    tool = tool_available(session, step.tool_name)
    if tool is None:
        known = step.tool_name in tool_definitions_by_name()
        _fail(step, "denied" if known else "unknown_tool",
              f"The tool {step.tool_name!r} is not available to this agent.")
        return Step.Status.FAILED
    errors = validate_arguments(tool.name, tool.parameters_schema, step.arguments)
    if errors:
        _fail(step, "invalid_arguments", "Invalid arguments: " + "; ".join(errors[:10]))
        return Step.Status.FAILED
    try:  # a secret the call may not use is refused before a reviewer is asked (and again at run time)
        secrets_check(team_id=session.team_id, tool_name=tool.name, values=secret_inputs(tool, step.arguments))
    except SecretRefused as exc:
        _fail(step, exc.code, exc.message)
        return Step.Status.FAILED
    engine_tool = hooks.ENGINE_TOOLS.get(tool.name)
    if engine_tool is not None:  # run by the engine itself (subagents): its own gate
        return engine_tool.gate(step=step, session=session)
    if tool.kind == ToolDefinition.Kind.CLIENT:
        # The integration runs it and posts the output by call_id; no lease: nothing runs here.
        step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.RUNNING,
                        event_type="tool.started",
                        event_payload={"client": True, "call_id": step.call_id, "arguments": step.arguments})
        return Step.Status.RUNNING
    # An approval policy of the team (issue 17) overrides the tool's own mode; none: as before.
    policy = approval_policy_resolve(team_id=session.team_id, agent_id=session.agent_id, tool_name=tool.name,
                                     arguments=step.arguments)
    mode = policy.mode if policy is not None else tool.approval_mode
    if mode == ApprovalMode.SAFE_READONLY or (
            mode == ApprovalMode.CONFIRM_ONCE
            and grant_use(session_id=session.id, turn_id=step.turn_id, step_id=step.id, tool_name=tool.name,
                          arguments=step.arguments,
                          spec=run_spec(tool=tool, arguments=step.arguments,
                                        sandbox_backend=str(sandbox_status().get("backend", "")))) is not None):
        step_transition(step_id=step.id, to=Step.Status.APPROVED, session_id=step.session_id, known=step)
        return Step.Status.APPROVED
    _ask_reviewer(step, session, tool, policy)
    return Step.Status.AWAITING_APPROVAL


def _ask_reviewer(step: Step, session: AgentSession, tool: ToolDefinition,
                  policy: ResolvedPolicy | None = None) -> ApprovalRequest:
    risk, note = (policy.risk, policy.reason) if policy is not None else tool_risk(tool)
    violated = [c["prohibition"] for c in step.checks or [] if c.get("violated")]
    if violated:  # the reviewer sees the verdicts next to the arguments (approval page)
        risk, note = "high", "The prohibitions check says this call may violate: " + "; ".join(violated)
    preview = ""
    local = hosting.workspace_is_local(session)  # else the session's host computes it (after commit)
    if tool.name == "write_file" and local:
        try:
            preview = write_file_preview(session_workspace(session), step.arguments)
        except Exception as exc:  # a preview is a courtesy; the approval must still be asked
            preview = f"(no preview: {exc})"
    approval = approval_request_create(step_id=step.id, risk=risk, risk_note=note, preview=preview,
                                       sandbox_backend=str(sandbox_status().get("backend", "")),
                                       network_policy=tool.network, policy=policy,
                                       approval_mode=policy.mode if policy is not None else tool.approval_mode,
                                       ttl_seconds=(policy.ttl_seconds if policy and policy.ttl_seconds
                                                    else tool.approval_ttl_seconds))
    if tool.name == "write_file" and not local:
        hosting.preview_elsewhere(step)
    return approval


class StepRebound(Conflict):
    """The approval did not cover what would run: it was invalidated and the step stopped (a fresh
    request, or failed when the tool is gone). Committed: the caller commits, and does not run."""

    code = "approval_stale"


def current_run(step: Step) -> tuple[ToolDefinition | None, str]:
    """The tool's definition as it is now (read fresh: the 2 s cache must not run an edited tool)
    and the hash of the spec of this step's call with it."""
    tool = ToolDefinition.objects.filter(name=step.tool_name).first()
    if tool is None:
        return None, ""
    return tool, spec_sha256(run_spec(tool=tool, arguments=step.arguments))


@joins_transaction
def tool_step_rebind(*, step: Step, approval: ApprovalRequest) -> None:
    """The approved call changed before it ran: cancel the approval with an ``approval.invalidated``
    event naming what changed, then ask a reviewer again, or fail the step when the tool is
    disabled or gone. The session is locked by the caller."""
    session = AgentSession.objects.select_related("agent").get(pk=step.session_id)
    tool = tool_available(session, step.tool_name)
    fresh = ToolDefinition.objects.filter(name=step.tool_name).first()
    current = run_spec(tool=fresh, arguments=step.arguments) if fresh else {}
    approved = with_arguments(approval.run_spec, approval.effective_arguments)
    changed = spec_differences(approved, current)
    approval_transition(request_id=approval.request_id, to=ApprovalRequest.Status.CANCELLED)
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="approval.invalidated",
                 payload={"request_id": str(approval.request_id), "team_id": session.team_id,
                          "tool": step.tool_name, "changed": changed,
                          "message": "What would run is not what was approved (changed: "
                                     f"{', '.join(changed) or 'unknown'}); the call did not run."})
    if tool is None or fresh is None or not fresh.enabled:
        _fail(step, "tool_unavailable",
              f"The tool {step.tool_name!r} was disabled or removed after the approval; the call did not run.")
    else:
        _ask_reviewer(step, session, fresh, approval_policy_resolve(
            team_id=session.team_id, agent_id=session.agent_id, tool_name=fresh.name, arguments=step.arguments))
    dispatch.tick_enqueue(step.turn_id)


@joins_transaction
def tool_step_claim(step: Step, *, owner: str | None = None) -> ApprovalRequest | None:
    """approved → running with a lease (held by ``owner``, this worker by default), consuming its
    approval (only a step a reviewer was asked about has one) in the same transaction. Returns the approval.

    Raises Conflict, after which the caller must roll back, when the approval was consumed already
    (a previous attempt ran it: never run it twice; the sweeper checks what really happened) or
    the step is no longer approved.
    """
    session_lock(step.session_id)
    approval = None if step.approval_mode == ApprovalMode.SAFE_READONLY else approval_approved_for_step(step.id)
    if approval is not None:
        _tool, run_hash = current_run(step)
        try:
            approval_consume(request_id=approval.request_id, run_sha256=run_hash)
        except RunSpecChanged as exc:
            tool_step_rebind(step=step, approval=approval)
            raise StepRebound(details=exc.details) from exc
    tool = tool_definitions_by_name().get(step.tool_name)
    claimed = step_claim(step_id=step.id, from_status=Step.Status.APPROVED,
                         lease_seconds=lease_seconds_for(tool.timeout_seconds if tool else 60),
                         event_type="tool.started", known=step, owner=owner)
    if claimed is None:
        raise Conflict(f"Step {step.id} is no longer approved", code="claim_lost")
    return approval


def tool_step_run(step_id: uuid.UUID | str) -> Step | None:
    """Claim, run and record one approved tool step (the sandbox queue's task). None when another
    worker has it."""
    step = Step.objects.filter(pk=step_id, status=Step.Status.APPROVED).first()
    if step is None:
        return None
    with transaction.atomic():
        try:
            approval = tool_step_claim(step)
        except StepRebound:
            return None  # committed: the approval is invalidated, a reviewer is asked again
        except Conflict:
            transaction.set_rollback(True)
            return None
    return tool_step_execute(step, approval)


def step_is_cancelled(step_id: uuid.UUID | str) -> bool:
    status = Step.objects.filter(pk=step_id).values_list("status", flat=True).first()
    return status in (None, Step.Status.CANCELLED)


def tool_step_execute(step: Step, approval: ApprovalRequest | None, session: AgentSession | None = None) -> Step | None:
    """Run a tool step this worker claimed, outside any transaction, and record its result."""
    session = session or AgentSession.objects.select_related("agent").get(pk=step.session_id)
    tool = tool_definitions_by_name().get(step.tool_name)
    if approval is not None:
        # What runs is built from this fresh definition, and its spec must be what was approved: an
        # admin's edit between the claim and here stops the call instead of changing it.
        tool, run_hash = current_run(step)
        if run_hash != (approval.approved_sha256 or approval.arguments_sha256):
            note = "The tool changed after the approval was consumed; the call did not run. Ask again."
            return tool_step_record(step=step, workspace=None,
                                    result={"status": "failed", "error_code": "approval_stale", "output": note})
    try:  # the only place values are decrypted: this task, for this call (vault_app.resolve)
        secrets = secrets_resolve(team_id=session.team_id, tool_name=step.tool_name,
                                  values=secret_inputs(tool, step.arguments))
    except SecretRefused as exc:
        return tool_step_record(step=step, workspace=None, result=secret_refusal_result(exc))
    workspace = session_workspace(session)
    manifest = None
    if tool is not None and not tool.idempotent:
        # Effect evidence before a mutating command: recovery compares the workspace with it.
        manifest = workspace_manifest(workspace)
        Step.objects.filter(pk=step.pk).update(manifest=manifest)
    runner = tool_runner(tool.kind) if tool is not None else None
    if runner is not None and tool is not None:  # a tool from a source (MCP): its app runs it
        result = runner(ToolRun(tool_name=tool.name, arguments=step.arguments, workspace=workspace,
                                timeout_seconds=tool.timeout_seconds, network=tool.network,
                                team_id=session.team_id, session_id=str(session.id), step_id=str(step.id),
                                idempotency_key=step.idempotency_key or str(step.id),
                                should_cancel=lambda: step_is_cancelled(step.id)))
    else:
        result = execute_tool(name=step.tool_name, workspace=workspace,
                              arguments={**step.arguments, **secrets.values["arguments"]},
                              timeout_seconds=tool.timeout_seconds if tool else None,
                              network=tool.network if tool else "none",
                              idempotency_key=step.idempotency_key or str(step.id),
                              should_cancel=lambda: step_is_cancelled(step.id), manifest_before=manifest,
                              live=live_output(step, secrets.redactor), env=secrets.values["env"])
    failpoint_after_tool(step.tool_name)
    payload = secrets.redactor.value(result.to_dict())  # before anything of it is stored
    if approval is not None and approval.edited_arguments is not None:
        payload["reviewer_note"] = ("Note: the reviewer changed the arguments before approving. You asked for "
                                    f"{approval.arguments}; what ran was {approval.edited_arguments}.")
    return tool_step_record(step=step, result=payload, workspace=workspace, redactor=secrets.redactor)


def secret_inputs(tool: ToolDefinition | None, arguments: Any) -> dict[str, Any]:
    """What of a call may reference secrets (SecretRefused for a reference elsewhere)."""
    return call_secret_inputs(tool_name=tool.name if tool else "", arguments=arguments,
                              env=dict(tool.env or {}) if tool is not None else {},
                              fields=SECRET_ARGUMENT_FIELDS.get(tool.name, ()) if tool is not None else (),
                              refusal=SECRET_ARGUMENT_REFUSALS.get(tool.name) if tool is not None else None)


def live_output(step: Step, redactor: Redactor | None = None) -> OutputBatcher:
    """Where a running command's output goes while it runs: ``tool.progress`` events of the step,
    batched and capped (``tools_app.sandbox.progress``), each in its own short transaction."""

    def record(batch: dict[str, Any]) -> None:
        if redactor:  # a value cut between two batches is redacted at both edges
            batch = redactor.value(batch, edges=True)
        event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="tool.progress",
                     payload={"index": step.index, "tool": step.tool_name, **batch})

    return OutputBatcher(record, interval=settings.AGENTOPS_PROGRESS_INTERVAL_SECONDS,
                         max_bytes=settings.AGENTOPS_PROGRESS_MAX_BYTES,
                         max_batches=settings.AGENTOPS_PROGRESS_MAX_EVENTS,
                         hold=redactor.unsafe_tail if redactor else None)


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


def tool_step_record(*, step: Step, result: dict[str, Any], workspace: Path | None,
                     redactor: Redactor | None = None) -> Step | None:
    """Record a tool's result: the step settled, the tool-call counter, published artifacts.
    None when the step was settled meanwhile (cancelled): the result is dropped."""
    ok = result.get("status") == "completed"
    artifacts = []
    if workspace is not None:
        for item in result.get("published_files") or []:
            stored = _store_artifact(step.session_id, workspace, item, redactor)
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
        step_result_dropped(step, "tool.result_dropped")
        return None
    return moved


def event_result(result: dict[str, Any]) -> dict[str, Any]:
    """A tool result as the live timeline shows it: the long output cut in the middle."""
    keep = ("status", "output", "exit_code", "duration_ms", "files_changed", "error_code", "error_message",
            "reviewer_note")
    out = {k: result.get(k) for k in keep if k in result}
    text = out.get("output")
    if isinstance(text, str) and len(text) > 8000:
        out["output"] = text[:4000] + "\n[… cut in the live view; the full output is stored …]\n" + text[-4000:]
    return out


def _store_artifact(session_id: uuid.UUID, workspace: Path, item: dict[str, Any],
                    redactor: Redactor | None = None) -> dict[str, Any] | None:
    """Upload a published file to central storage (``storages["artifacts"]``), content-addressed,
    so it outlives the workspace and its download never needs the sandbox host.

    Opened with ``open_beneath`` (no symlink leads out of the workspace) and hashed as it is copied
    to a spool file: the workspace may change meanwhile, and the name must be the hash of what was
    stored.
    """
    rel = str(item.get("path", ""))
    try:
        fd = open_beneath(workspace, workspace_relpath(rel), os.O_RDONLY | os.O_NONBLOCK)
    except (PathDenied, OSError):
        return None
    with tempfile.TemporaryFile() as spool:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            digest = hashlib.sha256()
            for chunk in _artifact_chunks(fd, redactor):
                digest.update(chunk)
                spool.write(chunk)
        finally:
            os.close(fd)
        size = spool.tell()
        spool.seek(0)
        storage = storages["artifacts"]
        name = f"{session_id}/{digest.hexdigest()}"
        if not storage.exists(name):  # content-addressed: the same bytes are stored once
            name = storage.save(name, File(spool))
    return {"path": rel, "size": size, "sha256": digest.hexdigest(), "storage_path": name,
            "content_type": mimetypes.guess_type(rel)[0] or "application/octet-stream"}


def _artifact_chunks(fd: int, redactor: Redactor | None) -> Iterator[bytes]:
    """The file's content; read whole and redacted when the team has secrets (a command may have
    written one into it: the stored copy holds ``[secret:NAME]`` instead)."""
    if not redactor:
        while chunk := os.read(fd, 1 << 20):
            yield chunk
        return
    content = bytearray()
    while chunk := os.read(fd, 1 << 20):
        content += chunk
    yield redactor.data(bytes(content))
