"""Writes of sandbox hosts: registration and heartbeat, pinning, going offline, moving a session.

Runners (tokens, signed jobs, results) are in ``hosts_app.runners``.
"""

import logging
import uuid
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from agentops import dispatch
from agentops.domain import Conflict, InvalidArguments, NotFound, joins_transaction
from agentops.permissions import OPERATE_SESSIONS, require_perm
from agentops.teams import OPERATE_ROLES, require_team_role
from hosts_app.models import AgentHostPolicy, SandboxHost, SessionPlacement
from sessions_app.events import event_record
from sessions_app.locks import session_lock
from sessions_app.models import AgentSession, Step, Turn

log = logging.getLogger(__name__)

PREVIEW_TASK = "hosts_app.tasks.step_preview_task"
MANIFEST_CHECK_TASK = "hosts_app.tasks.step_manifest_check_task"
SEED_TASK = "hosts_app.tasks.workspace_seed_task"
# Lease owners of an interrupted step whose host is asked, or awaited, for its manifest.
CHECKING = "manifest-check:"
AWAITING = "host-offline:"
# What wakes a runner's long-poll besides a step id: look at everything (a manifest check), or
# authenticate again (revoked).
WAKE_LOOK = "look"
WAKE_REVOKED = "revoked"


def wake_key(name: str) -> str:
    return f"agentops:runner:{name}"


def runner_wake(name: str, message: str) -> None:
    """Wake the runner's long-poll at once (after commit, where there is a transaction): with a
    step id it claims that step in the same database visit it re-authenticates in. The poll also
    looks at everything every second, so a lost wake-up only delays."""
    def send() -> None:
        try:
            pipe = dispatch.redis_client().pipeline(transaction=False)  # one round trip
            pipe.rpush(wake_key(name), message)
            pipe.expire(wake_key(name), 60)
            pipe.execute()
        except redis.RedisError:
            log.warning("runner %s not woken (Redis); its poll finds the work within a second", name)

    transaction.on_commit(send)


@transaction.atomic
def host_register(*, name: str, pool: str = "default", labels: list[str] | None = None, capacity: int = 8,
                  versions: dict[str, Any] | None = None, self_test: dict[str, Any] | None = None) -> SandboxHost:
    """A hosted host (a worker on ``sandbox.<name>``) says it is up: created or updated, online.
    A runner's name is refused (409): runners are created by a team's operator, with a token."""
    host = SandboxHost.objects.select_for_update().filter(name=name).first()
    if host is not None and host.kind != SandboxHost.Kind.HOSTED:
        raise Conflict(f"{name!r} is a runner's name", code="host_is_runner")
    if host is None:
        host = SandboxHost.objects.create(name=name, kind=SandboxHost.Kind.HOSTED, pool=pool)
    host.pool, host.labels, host.capacity = pool, sorted(labels or []), capacity
    host.versions, host.self_test = versions or {}, self_test or {}
    host.save(update_fields=["pool", "labels", "capacity", "versions", "self_test", "updated_at"])
    return host_heartbeat(host_id=host.id)


@joins_transaction
def host_heartbeat(*, host_id: uuid.UUID) -> SandboxHost:
    """The host is alive now. offline → online sends the manifest checks its interrupted steps
    waited for. 409 for a revoked runner (its token no longer works)."""
    host = SandboxHost.objects.select_for_update().get(pk=host_id)
    if host.status == SandboxHost.Status.REVOKED:
        raise Conflict("This runner was revoked.", code="runner_revoked")
    came_back = host.status != SandboxHost.Status.ONLINE
    host.ensure_can_move_to(SandboxHost.Status.ONLINE)
    host.status, host.last_heartbeat_at = SandboxHost.Status.ONLINE, timezone.now()
    host.save(update_fields=["status", "last_heartbeat_at", "updated_at"])
    if came_back:
        for step in Step.objects.filter(status=Step.Status.RUNNING, lease_owner=f"{AWAITING}{host.name}"):
            manifest_check_request(step=step, host=host)
    return host


def hosts_mark_offline(*, now: Any = None) -> list[str]:
    """The sweeper: online hosts with no heartbeat for AGENTOPS_HOST_OFFLINE_SECONDS go offline."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.AGENTOPS_HOST_OFFLINE_SECONDS)
    names = []
    for host_id in SandboxHost.objects.filter(status=SandboxHost.Status.ONLINE).filter(
            Q(last_heartbeat_at__lt=cutoff) | Q(last_heartbeat_at__isnull=True)).values_list("pk", flat=True):
        with transaction.atomic():
            host = SandboxHost.objects.select_for_update().get(pk=host_id)
            if host.status == SandboxHost.Status.ONLINE and (host.last_heartbeat_at is None
                                                              or host.last_heartbeat_at < cutoff):
                host.status = SandboxHost.Status.OFFLINE
                host.save(update_fields=["status", "updated_at"])
                names.append(host.name)
                log.warning("sandbox host %s stopped heartbeating: offline", host.name)
    return names


def _candidates(session: AgentSession, pool: str | None = None) -> list[SandboxHost]:
    """The hosts the session may use: of its agent's pool and labels, or of ``pool`` (any labels)."""
    policy = None if pool is not None else AgentHostPolicy.objects.filter(agent_id=session.agent_id).first()
    if pool is None:
        pool = policy.pool if policy else "default"
    wanted = set(policy.labels if policy else [])
    hosts = (SandboxHost.objects.filter(pool=pool).exclude(status=SandboxHost.Status.REVOKED)
             .filter(Q(kind=SandboxHost.Kind.HOSTED) | Q(team_id=session.team_id))
             .annotate(load=Count("placements", filter=Q(placements__session__turns__status__in=Turn.ACTIVE),
                                  distinct=True)))
    return [h for h in hosts if wanted <= set(h.labels or [])]


def _pinned(session: AgentSession) -> SandboxHost | None:
    existing = SessionPlacement.objects.select_related("host").filter(session_id=session.pk).first()
    return existing.host if existing is not None else None


def _pin(session: AgentSession, hosts: list[SandboxHost], **extra: object) -> SandboxHost:
    """Pin ``session`` to the least loaded online host of ``hosts`` (load / capacity; a team's
    runner before a shared host on a tie; with none online, to one anyway: its work waits, visibly)."""
    online = [h for h in hosts if h.status == SandboxHost.Status.ONLINE] or hosts
    best = min(online, key=lambda h: (getattr(h, "load", 0) / max(1, h.capacity), h.kind != SandboxHost.Kind.RUNNER,
                                      h.name))
    placement, created = SessionPlacement.objects.get_or_create(session_id=session.pk, defaults={"host": best})
    if created:
        event_record(session_id=session.pk, type="session.pinned",
                     payload={"host": best.name, "kind": best.kind, "pool": best.pool, **extra})
    return placement.host


@joins_transaction
def session_pin(*, session: AgentSession) -> SandboxHost | None:
    """Pin a session to a host of its agent's pool carrying its labels (``_pin``). Idempotent: a
    pinned session keeps its host. None when the pool has no host at all (one machine: the shared queue)."""
    if (pinned := _pinned(session)) is not None:
        return pinned
    hosts = _candidates(session)
    return _pin(session, hosts) if hosts else None


@joins_transaction
def session_pin_chosen(*, session: AgentSession, host_name: str | None = None,
                       pool: str | None = None) -> SandboxHost:
    """Pin a new session where its creator chose (the wire's ``self_hosted`` environment): the host
    ``host_name`` (a hosted host, or a runner of the session's team), else the least loaded host of
    ``pool``. 400 when no such host may take it; a session already pinned keeps its host."""
    if (pinned := _pinned(session)) is not None:
        return pinned
    if host_name is not None:
        hosts = list(SandboxHost.objects.filter(name=host_name).exclude(status=SandboxHost.Status.REVOKED)
                     .filter(Q(kind=SandboxHost.Kind.HOSTED) | Q(team_id=session.team_id)))
    else:
        hosts = _candidates(session, pool=pool)
    if not hosts:
        what = f"sandbox host {host_name!r}" if host_name is not None else f"host in pool {pool!r}"
        raise InvalidArguments(f"No {what} can take this session's team's work",
                               details={"field": "environment_id" if host_name is not None else "pool"})
    return _pin(session, hosts, chosen=True)


def step_host_unavailable(*, step: Step, host: SandboxHost) -> None:
    """Tell the timeline why a tool call waits: its host is offline (it runs when the host returns)."""
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="host.waiting",
                 payload={"host": host.name, "status": host.status,
                          "reason": f"Waiting for sandbox host {host.name} ({host.status}); the call runs when "
                                    "it is back, or an operator moves the session to another host."})


@joins_transaction
def manifest_check_request(*, step: Step, host: SandboxHost) -> None:
    """Ask the host to compare the interrupted step's workspace with its manifest (after commit);
    the step stays running under a lease owned by the check until the host answers."""
    Step.objects.filter(pk=step.pk).update(
        lease_owner=f"{CHECKING}{host.name}",
        lease_expires_at=timezone.now() + timedelta(seconds=settings.AGENTOPS_HOST_OFFLINE_SECONDS * 3))
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="host.manifest_check",
                 payload={"host": host.name})
    if host.kind == SandboxHost.Kind.HOSTED:
        dispatch.host_task_enqueue(MANIFEST_CHECK_TASK, [str(step.id)], queue=host.queue)
    else:  # a runner is asked in its poll (hosts_app.runners), woken now
        runner_wake(host.name, WAKE_LOOK)


def step_await_host(*, step: Step, host: SandboxHost) -> str:
    """The interrupted step's host is offline: wait AGENTOPS_HOST_GIVE_UP_SECONDS for it to return
    (its heartbeat then asks for the manifest check); the sweeper decides after that."""
    Step.objects.filter(pk=step.pk).update(
        lease_owner=f"{AWAITING}{host.name}",
        lease_expires_at=timezone.now() + timedelta(seconds=settings.AGENTOPS_HOST_GIVE_UP_SECONDS))
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="host.waiting",
                 payload={"host": host.name, "status": host.status,
                          "reason": f"Sandbox host {host.name} stopped while the call ran; its workspace is "
                                    "checked when the host returns, else a reviewer decides."})
    return "awaiting_host"


@transaction.atomic
def session_move(*, session_id: uuid.UUID | str, host_name: str, actor: User) -> SessionPlacement:
    """Move a session to another host of its team (an operator's decision, e.g. its host is gone):
    a new workspace there, seeded from the session's artifacts, with a ``session.moved`` event.
    Refused (409) while one of its tool calls runs or waits in a queue. Idempotent."""
    require_perm(actor, OPERATE_SESSIONS)
    try:
        session_lock(session_id)
        session = AgentSession.objects.get(pk=session_id)
    except (AgentSession.DoesNotExist, ValueError) as exc:
        raise NotFound(f"No session {session_id}") from exc
    require_team_role(actor, session.team_id, OPERATE_ROLES, what="move this session")
    target = SandboxHost.objects.filter(name=host_name).exclude(status=SandboxHost.Status.REVOKED).first()
    if target is None or (target.kind == SandboxHost.Kind.RUNNER and target.team_id != session.team_id):
        raise InvalidArguments(f"No sandbox host {host_name!r} for this session", details={"field": "host"})
    placement = SessionPlacement.objects.select_for_update().filter(session=session).first()
    if placement is not None and placement.host_id == target.id:
        return placement
    if Step.objects.filter(session=session, kind=Step.Kind.TOOL,
                           status__in=(Step.Status.APPROVED, Step.Status.RUNNING)).exists():
        raise Conflict("A tool call of this session is running or queued; cancel it (or let a reviewer settle "
                       "it) before moving the session.", code="session_busy")
    previous = placement.host.name if placement else ""
    if placement is None:
        placement = SessionPlacement(session=session, host=target)
    placement.host, placement.moved_at, placement.moved_by = target, timezone.now(), actor
    placement.save()
    AgentSession.objects.filter(pk=session.pk).update(workspace="")  # the new host makes its own
    event_record(session_id=session.pk, type="session.moved",
                 payload={"from": previous, "to": target.name, "by": actor.get_username(),
                          "seeded_from": "artifacts"})
    if target.kind == SandboxHost.Kind.HOSTED:
        dispatch.host_task_enqueue(SEED_TASK, [str(session.pk)], queue=target.queue)
    return placement
