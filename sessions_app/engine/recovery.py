"""The sweeper: expired approvals, expired leases, and turns whose next tick was lost.

A mutating tool is never blindly replayed: its effect is checked first. The outbox dedupes
send_email by idempotency key; a command that ran without network is retried only when the
workspace is unchanged since the manifest taken before it started; otherwise the step is
``in_doubt`` and a reviewer decides (retry, mark done, fail).
"""

import logging
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from agentops import dispatch
from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_expire_due, approval_request_create
from sessions_app import hooks
from sessions_app.engine.hosting import hooks as hosting
from sessions_app.engine.turns import turn_fail
from sessions_app.events import event_record
from sessions_app.locks import session_lock
from sessions_app.models import MODEL_KINDS, Step, Turn
from sessions_app.services import step_transition
from tools_app.models import NetworkPolicy, ToolDefinition
from tools_app.sandbox import changes_text, workspace_changes_since
from tools_app.selectors import tool_definitions_by_name

log = logging.getLogger(__name__)

MODEL_MAX_ATTEMPTS = 3
# A step in one of these waits for someone (a worker under its lease, a reviewer, the integration):
# a tick of its turn would only find it still waiting.
IN_FLIGHT = (Step.Status.RUNNING, Step.Status.AWAITING_APPROVAL, Step.Status.IN_DOUBT)
KICK_CANDIDATES_FACTOR = 5


def sweep() -> dict[str, int]:
    """One pass of the sweeper (Celery beat runs it every ``AGENTOPS_SWEEP_SECONDS``)."""
    counts = {"approvals_expired": approval_expire_due(), "steps_recovered": 0, "client_calls_timed_out": 0,
              "turns_kicked": 0}
    now = timezone.now()
    for step_id in Step.objects.filter(status=Step.Status.RUNNING, lease_expires_at__lt=now).values_list(
            "pk", flat=True):
        if step_recover(step_id):
            counts["steps_recovered"] += 1
    counts["client_calls_timed_out"] = client_calls_expire(now=now)
    counts["waits_overdue"] = engine_waits_overdue_wake(now=now)
    counts["turns_kicked"] = turns_kick_quiet(now=now)
    return counts


def engine_waits_overdue_wake(*, now: datetime) -> int:
    """Tick the turns whose engine-run step (``hooks.ENGINE_TOOLS``: subagents) waits past its tool's
    timeout: the step's poll enforces the timeout, but only a tick asks it, and only a child's end
    ticked the parent. A spawn of 15 s whose child ran 90 s waited the 90 s; one whose child waited
    on an approval nobody decided, the approval's day. Each sweep wakes them until they settle."""
    names = list(hooks.ENGINE_TOOLS)
    if not names:
        return 0
    tools = tool_definitions_by_name()
    waiting = Step.objects.filter(status=Step.Status.RUNNING, lease_expires_at__isnull=True, tool_name__in=names,
                                  started_at__isnull=False).values_list("turn_id", "tool_name", "started_at")
    woken = 0
    for turn_id, tool_name, started_at in waiting:
        tool = tools.get(tool_name)
        if tool is not None and started_at is not None and started_at < now - timedelta(seconds=tool.timeout_seconds):
            dispatch.tick_enqueue(turn_id)
            woken += 1
    return woken


def turns_quiet(*, now: datetime, limit: int) -> list[uuid.UUID]:
    """Active turns that can move but have not for ``AGENTOPS_KICK_QUIET_SECONDS``: no step in
    flight (every blocking step settled), and no event in their session since. The quietest first.

    Such a turn lost its wake-up (a tick or a decision's wake-up sent while Redis was down). A turn
    with a step in flight (and none approved) is left alone: the step's worker, reviewer or integration wakes it, and an
    expired lease or a client call past its timeout is the sweeper's other work.
    """
    quiet = now - timedelta(seconds=settings.AGENTOPS_KICK_QUIET_SECONDS)
    in_flight = Step.objects.filter(turn=OuterRef("pk"), status__in=IN_FLIGHT)
    # An approved call runs even while another of the turn waits for its reviewer (the plan runs
    # approved ones first): its lost wake-up counts too (found by the chaos proof).
    approved = Step.objects.filter(turn=OuterRef("pk"), status=Step.Status.APPROVED)
    return list(Turn.objects.filter(status__in=Turn.ACTIVE, updated_at__lt=quiet)
                .filter(Q(session__last_event_at__lt=quiet) | Q(session__last_event_at__isnull=True))
                .filter(~Exists(in_flight) | Exists(approved)).order_by("session__last_event_at")
                .values_list("pk", flat=True)[:limit])


def turns_kick_quiet(*, now: datetime) -> int:
    """Re-drive quiet turns, bounded so that an overloaded box is not flooded: none while the
    engine's backlog is deep (busy is not stuck), at most ``AGENTOPS_KICK_MAX_PER_SWEEP``, and a turn
    whose earlier kick is still queued is not kicked again. Returns how many kicks were sent."""
    try:
        room = settings.AGENTOPS_KICK_QUEUE_LIMIT - dispatch.engine_backlog()
    except redis.RedisError:
        log.warning("sweeper: Redis is unreachable; no quiet turn kicked this time")
        return 0
    limit = min(settings.AGENTOPS_KICK_MAX_PER_SWEEP, room)
    if limit <= 0:
        log.info("sweeper: the engine's backlog is deep; no quiet turn kicked this time")
        return 0
    sent = 0
    # Past the quietest few whose kick is still queued (skipped), up to ``limit`` others.
    for turn_id in turns_quiet(now=now, limit=limit * KICK_CANDIDATES_FACTOR):
        sent += dispatch.turn_kick_enqueue(turn_id)
        if sent >= limit:
            break
    return sent


def client_calls_expire(*, now: datetime) -> int:
    """Fail the client tool calls that waited longer than their tool's timeout (error code
    ``client_timeout``) and wake their turns: the model hears that the call got no answer."""
    count = 0
    for tool in tool_definitions_by_name().values():
        if tool.kind != ToolDefinition.Kind.CLIENT:
            continue
        due = Step.objects.filter(kind=Step.Kind.TOOL, tool_name=tool.name, status=Step.Status.RUNNING,
                                  lease_expires_at__isnull=True,
                                  started_at__lt=now - timedelta(seconds=tool.timeout_seconds))
        for step_id in due.values_list("pk", flat=True):
            count += client_call_expire(step_id, timeout_seconds=tool.timeout_seconds)
    return count


def client_call_expire(step_id: uuid.UUID, *, timeout_seconds: int) -> int:
    """Fail one waiting client call (a no-op when its output arrived meanwhile)."""
    session_id = Step.objects.filter(pk=step_id).values_list("session_id", flat=True).first()
    if session_id is None:
        return 0
    with transaction.atomic():
        session_lock(session_id)
        step = Step.objects.select_for_update().filter(pk=step_id).first()
        if step is None or step.status != Step.Status.RUNNING or step.lease_expires_at is not None:
            return 0
        message = f"The client did not submit an output for this call within {timeout_seconds} s."
        result = {"status": "failed", "output": message, "error_code": "client_timeout"}
        step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.FAILED, event_type="tool.failed",
                        event_payload={"result": result, "client": True}, result=result,
                        error_code="client_timeout", error_message=message)
        dispatch.tick_enqueue(step.turn_id)
    return 1


def step_recover(step_id: uuid.UUID | str) -> bool:
    """Decide what to do with one step whose lease expired. Returns True when it changed."""
    session_id = Step.objects.filter(pk=step_id).values_list("session_id", flat=True).first()
    if session_id is None:
        return False
    with transaction.atomic():
        session_lock(session_id)
        step = Step.objects.select_for_update().filter(pk=step_id).first()
        if step is None or step.status != Step.Status.RUNNING or step.lease_expires_at is None \
                or step.lease_expires_at >= timezone.now():
            return False
        outcome = _recover(step)
        log.warning("recovering step %s (%s %s, attempt %d): %s", step.id, step.kind, step.tool_name,
                    step.attempts, outcome)
        event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="step.recovered",
                     payload={"kind": step.kind, "tool": step.tool_name, "attempts": step.attempts,
                              "outcome": outcome})
        dispatch.tick_enqueue(step.turn_id)
    return True


def _back_to(step: Step, to: str) -> None:
    step_transition(step_id=step.id, session_id=step.session_id, to=to, lease_owner="", lease_expires_at=None)


def _recover(step: Step) -> str:
    """Retry, fail or ask a reviewer, by what is known of the step's effect."""
    if step.kind in MODEL_KINDS:
        if step.attempts >= MODEL_MAX_ATTEMPTS:
            message = "The model call kept dying."
            step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.FAILED,
                            event_type="model.failed", error_code="model_unavailable", error_message=message)
            turn_fail(turn_id=step.turn_id, code="model_unavailable", message=message, retryable=True)
            return "failed"
        _back_to(step, Step.Status.PLANNED)
        return "retry"  # model calls have no side effects
    elsewhere = hosting.recover_elsewhere(step)  # its host checks the manifest, or a reviewer decides
    if elsewhere is not None:
        return elsewhere
    tool = ToolDefinition.objects.filter(name=step.tool_name).first()
    if step.attempts >= (tool.max_attempts if tool else 1):
        return _in_doubt(step, "The call was interrupted too often; its outcome is unknown.")
    if tool is not None and tool.idempotent:
        # Re-running gives the same effect (read-only tools, write_file, send_email via the
        # outbox's unique idempotency key).
        _back_to(step, Step.Status.APPROVED)
        return "retry"
    workspace = Path(step.session.workspace) if step.session.workspace else None
    # An MCP tool's effect lives in its server, not in the workspace: no manifest can tell.
    if tool is None or tool.network != NetworkPolicy.NONE or workspace is None \
            or tool.kind == ToolDefinition.Kind.MCP:
        return _in_doubt(step, "The worker died while the call ran; it may have reached the network, so its "
                               "effect is unknown.")
    # The manifest is saved before the command starts: without it nothing ran.
    changes = workspace_changes_since(workspace, step.manifest) if step.manifest is not None else None
    if changes is None:
        _back_to(step, Step.Status.APPROVED)
        return "retry"
    # Which files, so the reviewer can tell whether the command's effect happened ("the workspace
    # changed" alone left them guessing whether count.txt already had its line).
    return _in_doubt(step, "The worker died while the command ran and the workspace changed since it started: "
                           f"{changes_text(changes)}.")


def _in_doubt(step: Step, note: str) -> str:
    step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.IN_DOUBT, event_type="tool.in_doubt",
                    lease_owner="", lease_expires_at=None, event_payload={"reason": note})
    approval_request_create(step_id=step.id, kind=ApprovalRequest.Kind.RECOVERY, risk="high", risk_note=note,
                            ttl_seconds=0)
    return "in_doubt"
