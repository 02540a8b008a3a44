"""Customer runners: per-runner tokens (hashed at rest, revocable, renewable), signed jobs (Ed25519,
``hosts_app.runner_keys``), idempotent results.

A runner authenticates with its token on every request; a revoked runner's token stops working at
once (the next request, the long-poll included, is 401). Jobs are the approved tool steps of the
sessions pinned to it, claimed here exactly as a hosted worker claims them (``tool_step_claim``:
the approval is consumed once), then signed (``agentops.runner.protocol``). A result names its
job; the first upload is recorded, a re-sent one finds its ``RunnerResult`` and changes nothing.
"""

import logging
import secrets
import time
import uuid
from datetime import timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from agentops import dispatch
from agentops.domain import Conflict, DomainError, NotFound
from agentops.models import Team
from agentops.runner.protocol import TOKEN_PREFIX, sign, spec_sha256, token_hash, token_with_key
from agentops.teams import OPERATE_ROLES, require_team_role
from hosts_app.models import RunnerResult, SandboxHost
from hosts_app.runner_files import file_part_store, not_uploaded_note, published_files_forget, published_files_store
from hosts_app.runner_keys import runner_public_key, runner_signing_key
from hosts_app.services import CHECKING, WAKE_REVOKED, host_heartbeat, runner_wake
from sessions_app.engine.recovery import _back_to, _in_doubt
from sessions_app.engine.tool_steps import StepRebound, current_run, tool_step_claim, tool_step_record
from sessions_app.events import event_record
from sessions_app.locks import session_lock
from sessions_app.models import Step
from sessions_app.services import artifact_record

log = logging.getLogger(__name__)

JOB_TTL_SECONDS = 300
RUNNER_TOOLS = frozenset({"run_command", "read_file", "write_file", "list_files", "publish_artifact"})


class RunnerTokenOutdated(DomainError):
    """A runner token from before jobs were signed with Ed25519: the runner needs a new token."""

    code = "runner_token_outdated"
    status = 401


def _new_token(host: SandboxHost) -> str:
    """A new token for ``host`` (its fields set, not saved): the secret, hashed at rest, and the
    public key of the key pair that goes with it, pinned by the runner."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    host.token_hash = token_hash(secret)
    host.public_key = runner_public_key(host)
    return token_with_key(secret, host.public_key)


@transaction.atomic
def runner_create(*, team: Team, name: str, actor: User, pool: str = "default",
                  labels: list[str] | None = None, capacity: int = 8) -> tuple[SandboxHost, str]:
    """A runner of ``team``; returns it and its token (shown once: only its secret's hash and its
    public key are kept)."""
    require_team_role(actor, team.pk, OPERATE_ROLES, what="create runners")
    if SandboxHost.objects.filter(name=name).exists():
        raise Conflict(f"A sandbox host named {name!r} exists", code="host_exists")
    host = SandboxHost(name=name, kind=SandboxHost.Kind.RUNNER, team=team, pool=pool,
                       labels=sorted(labels or []), capacity=capacity)
    token = _new_token(host)
    host.save(force_insert=True)
    return host, token


@transaction.atomic
def runner_token_rotate(*, name: str, actor: User) -> tuple[SandboxHost, str]:
    """A new token (and key pair) for a runner; the old token is refused from the next request on,
    its running long-poll included. How a runner created before signed jobs gets a key to pin."""
    host = SandboxHost.objects.select_for_update().filter(name=name, kind=SandboxHost.Kind.RUNNER).first()
    if host is None:
        raise NotFound(f"No runner {name!r}")
    require_team_role(actor, host.team_id or 0, OPERATE_ROLES, what="renew runner tokens")
    if host.status == SandboxHost.Status.REVOKED:
        raise Conflict("This runner was revoked.", code="runner_revoked")
    token = _new_token(host)
    host.save(update_fields=["token_hash", "public_key", "updated_at"])
    log.warning("runner %s got a new token (by %s)", host.name, actor.username)
    runner_wake(host.name, WAKE_REVOKED)  # its running long-poll authenticates again, now: 401
    return host, token


@transaction.atomic
def runner_revoke(*, name: str, actor: User) -> SandboxHost:
    """Revoke a runner: its token is refused from the next request on, for good. Idempotent."""
    host = SandboxHost.objects.select_for_update().filter(name=name, kind=SandboxHost.Kind.RUNNER).first()
    if host is None:
        raise NotFound(f"No runner {name!r}")
    require_team_role(actor, host.team_id or 0, OPERATE_ROLES, what="revoke runners")
    if host.status == SandboxHost.Status.REVOKED:
        return host
    host.ensure_can_move_to(SandboxHost.Status.REVOKED)
    host.status, host.revoked_at = SandboxHost.Status.REVOKED, timezone.now()
    host.save(update_fields=["status", "revoked_at", "updated_at"])
    runner_wake(host.name, WAKE_REVOKED)  # its running long-poll authenticates again, now: 401
    return host


def runner_authenticate(token: str) -> SandboxHost | None:
    """The runner holding this token (its secret part), or None (unknown or revoked: the request is
    refused). RunnerTokenOutdated for a runner from before signed jobs: it must get a new token."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    host = SandboxHost.objects.filter(token_hash=token_hash(token), kind=SandboxHost.Kind.RUNNER).first()
    if host is None or host.status == SandboxHost.Status.REVOKED:
        return None
    if not host.public_key:
        raise RunnerTokenOutdated(
            f"Runner {host.name}'s token is from before jobs were signed with Ed25519: an operator of its team "
            f"gives it a new one with POST /api/runners/{host.name}/token.")
    return host


def runner_heartbeat(*, host: SandboxHost, versions: dict[str, Any], self_test: dict[str, Any]) -> SandboxHost:
    SandboxHost.objects.filter(pk=host.pk).update(versions=versions, self_test=self_test)
    return host_heartbeat(host_id=host.id)


def _signed(host: SandboxHost, key: Ed25519PrivateKey, job: dict[str, Any]) -> dict[str, Any]:
    job = {**job, "runner": host.name, "issued_at": time.time(), "expires_at": time.time() + JOB_TTL_SECONDS}
    return {"job": job, "signature": sign(key, job)}


def _manifest_job(host: SandboxHost, key: Ed25519PrivateKey) -> dict[str, Any] | None:
    step = Step.objects.filter(status=Step.Status.RUNNING, lease_owner=f"{CHECKING}{host.name}").first()
    if step is None:
        return None
    return _signed(host, key, {"type": "manifest_check", "job_id": f"{step.id}:{step.attempts}",
                               "step_id": str(step.id), "session_id": str(step.session_id)})


def _claim_one(host: SandboxHost, key: Ed25519PrivateKey, step_id: uuid.UUID | None = None) -> dict[str, Any] | None:
    waiting = Step.objects.filter(kind=Step.Kind.TOOL, status=Step.Status.APPROVED, session__placement__host=host)
    if step_id is not None:
        waiting = waiting.filter(pk=step_id)
    for step in waiting.order_by("created_at")[:5]:
        with transaction.atomic():
            try:
                approval = tool_step_claim(step, owner=f"runner:{host.name}")
            except StepRebound:
                continue
            except Conflict:
                transaction.set_rollback(True)
                continue
            tool, run_hash = current_run(step)
            if approval is not None and run_hash != (approval.approved_sha256 or approval.arguments_sha256):
                transaction.set_rollback(True)  # the tool changed after the approval: the sweeper re-asks
                continue
        if tool is None or tool.name not in RUNNER_TOOLS:
            runner_result_record(host=host, job_id=f"{step.id}:{step.attempts}", result={
                "status": "failed", "error_code": "unsupported_on_runner",
                "output": f"The tool {step.tool_name!r} does not run on a customer runner."}, files=[])
            continue
        from tools_app.binding import run_spec

        spec = run_spec(tool=tool, arguments=step.arguments)
        # approved_sha256 is the approval's own hash: the runner checks the spec hashes to it.
        return _signed(host, key, {"type": "tool", "job_id": f"{step.id}:{step.attempts}", "step_id": str(step.id),
                                   "session_id": str(step.session_id), "tool": step.tool_name,
                                   "arguments": step.arguments, "timeout_seconds": tool.timeout_seconds,
                                   "network": tool.network, "idempotent": tool.idempotent, "spec": spec,
                                   "approval_sha256": spec_sha256(spec),
                                   "approval_request_id": str(approval.request_id) if approval else None,
                                   "approved_sha256": (approval.approved_sha256 or approval.arguments_sha256)
                                   if approval else None})
    return None


def runner_next_job(*, host: SandboxHost) -> dict[str, Any] | None:
    """The next signed job for this runner (a manifest check first), claimed; None when none waits.
    RunnerKeyUnavailable, before anything is claimed, when its jobs cannot be signed."""
    key = runner_signing_key(host)
    return _manifest_job(host, key) or _claim_one(host, key)


def runner_woken_job(*, host: SandboxHost, message: str) -> dict[str, Any] | None:
    """The job a wake-up names: the step the engine just handed over, claimed by its id (one
    query to find it); any other message (a manifest check, a revocation) looks at everything."""
    try:
        step_id = uuid.UUID(message)
    except ValueError:
        return runner_next_job(host=host)
    return _claim_one(host, runner_signing_key(host), step_id)


def _step_of(host: SandboxHost, job_id: str) -> Step:
    step_id, _, _attempt = job_id.partition(":")
    try:
        step = Step.objects.filter(pk=uuid.UUID(step_id), session__placement__host=host).first()
    except ValueError as exc:
        raise NotFound(f"No job {job_id}") from exc
    if step is None:
        raise NotFound(f"No job {job_id}")
    return step


def runner_progress(*, host: SandboxHost, job_id: str, output: str) -> None:
    """Live output of a running job (``tool.progress``); it also renews the job's lease."""
    step = _step_of(host, job_id)
    if step.status != Step.Status.RUNNING or step.lease_owner != f"runner:{host.name}":
        return
    Step.objects.filter(pk=step.pk, lease_owner=f"runner:{host.name}").update(
        lease_expires_at=timezone.now() + timedelta(seconds=settings.AGENTOPS_LEASE_SECONDS * 10 + 60))
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="tool.progress",
                 payload={"index": step.index, "tool": step.tool_name, "output": output[:8000], "runner": host.name})


def runner_file_part(*, host: SandboxHost, job_id: str, sha256: str, offset: int, size: int, data: bytes) -> int:
    """One part of a file the job published (``hosts_app.runner_files``); ignored once the job's
    result is recorded (a result sent again after a lost acknowledgement re-sends its parts)."""
    step = _step_of(host, job_id)
    if RunnerResult.objects.filter(job_id=job_id).exists():
        return offset + len(data)
    return file_part_store(step=step, job_id=job_id, sha256=sha256, offset=offset, size=size, data=data)


def runner_result_record(*, host: SandboxHost, job_id: str, result: dict[str, Any],
                         files: list[dict[str, Any]]) -> bool:
    """Record a job's result once. True when recorded now; False for a re-sent result (nothing
    changes). A result for a step no longer running for this runner (cancelled, in doubt) is kept
    as received but changes no step."""
    step = _step_of(host, job_id)
    if RunnerResult.objects.filter(job_id=job_id).update(deliveries=F("deliveries") + 1):
        published_files_forget(step=step, job_id=job_id, files=files)
        return False
    stored, missing = published_files_store(step=step, job_id=job_id, files=files)
    with transaction.atomic():
        try:
            with transaction.atomic():
                RunnerResult.objects.create(job_id=job_id, host=host, step=step, result=result)
        except IntegrityError:
            RunnerResult.objects.filter(job_id=job_id).update(deliveries=F("deliveries") + 1)
            return False
        # Its result is the truth even when the sweeper began to ask for a manifest check meanwhile.
        if step.status == Step.Status.RUNNING and step.lease_owner in (f"runner:{host.name}",
                                                                       f"{CHECKING}{host.name}"):
            clean = {k: result.get(k) for k in ("status", "output", "exit_code", "duration_ms", "files_changed",
                                                "error_code", "error_message", "stdout", "stderr", "truncated")
                     if k in result}
            clean["status"] = "completed" if result.get("status") == "completed" else "failed"
            if missing:  # said where the reviewer and the model read it
                clean["output"] = f"{clean.get('output') or ''}{not_uploaded_note(missing)}"
                clean["files_not_uploaded"] = missing
            moved = tool_step_record(step=step, result=clean, workspace=None)
            if moved is not None:
                for item in stored:
                    artifact_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, **item)
            dispatch.tick_enqueue(step.turn_id)
    return True


def runner_refusal_record(*, host: SandboxHost, job_id: str, reason: str, replayed: bool = False) -> None:
    """The runner refused a job (its signature or approval hash did not verify): nothing ran. The
    step fails with ``job_refused`` and the timeline says why. A job refused as ``replayed`` had
    already run there once: the timeline says so and the step keeps that run's outcome."""
    try:
        step = _step_of(host, job_id)
    except NotFound:
        log.warning("runner %s refused an unknown job %r: %s", host.name, job_id[:100], reason[:200])
        return
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="runner.job_refused",
                 payload={"runner": host.name, "reason": reason[:500], "replayed": replayed})
    if replayed:
        log.warning("runner %s was served job %s again (a replay) and refused it", host.name, job_id[:100])
        return
    if step.status == Step.Status.RUNNING and step.lease_owner == f"runner:{host.name}":
        result = {"status": "failed", "error_code": "job_refused",
                  "output": f"The runner refused the job ({reason[:200]}); nothing ran."}
        tool_step_record(step=step, result=result, workspace=None)
        dispatch.tick_enqueue(step.turn_id)


def runner_manifest_answer(*, host: SandboxHost, job_id: str, changed: bool | None) -> str:
    """The runner compared the interrupted job's workspace with its manifest: unchanged → retry;
    changed or unknown → in doubt (a reviewer decides)."""
    step = _step_of(host, job_id)
    with transaction.atomic():
        session_lock(step.session_id)
        step = Step.objects.select_for_update().get(pk=step.pk)
        if step.status != Step.Status.RUNNING or step.lease_owner != f"{CHECKING}{host.name}":
            return "settled"
        if changed is False:
            _back_to(step, Step.Status.APPROVED)
            outcome = "retry"
        else:
            outcome = _in_doubt(step, f"Runner {host.name} reports the workspace changed since the command started "
                                      "(or it does not know). A reviewer decides.")
        event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="step.recovered",
                     payload={"kind": step.kind, "tool": step.tool_name, "outcome": outcome, "checked_on_host": True})
        dispatch.tick_enqueue(step.turn_id)
    return outcome

