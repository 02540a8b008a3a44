"""What the engine asks the sandbox hosts (``sessions_app.engine.hosting``, ``agentops.dispatch``).

Installed in ``AppConfig.ready()``. Each answer starts from the session's placement, pinning the
session first if it has none yet (its first tick: ``session_pin`` picks the least loaded host).
"""

import time

from django.conf import settings
from django.utils import timezone

from agentops import dispatch
from hosts_app.models import SandboxHost
from hosts_app.services import (
    AWAITING,
    CHECKING,
    PREVIEW_TASK,
    manifest_check_request,
    runner_wake,
    session_pin,
    step_await_host,
    step_host_unavailable,
)
from sessions_app.engine import hosting
from sessions_app.engine.recovery import _in_doubt
from sessions_app.models import AgentSession, Step

CACHE = "_agentops_host"


# With no host registered at all (one machine, no `sandbox_host` anywhere) a tick must not pay a
# query for hosts: whether any exists is asked at most once per NO_HOSTS_SECONDS in a process (a new
# host is used after that). The first tick past the last answer asks; the ticks running meanwhile keep
# that answer. Before, every tick that found the answer expired asked (pin lookup, candidates, exists)
# until one of them had stored the new one: under load a burst of them, about 4 % of a model
# gateway's CPU (py-spy, bench/concurrency.py N = 300).
NO_HOSTS_SECONDS = 2.0
_hosts_exist: bool | None = None
_hosts_asked_at = 0.0


def cache_clear() -> None:
    global _hosts_exist
    _hosts_exist = None


def _any_host() -> bool:
    global _hosts_exist, _hosts_asked_at
    now = time.monotonic()
    if _hosts_exist is None or now - _hosts_asked_at >= NO_HOSTS_SECONDS:
        _hosts_asked_at = now  # first: the ticks that come while this one asks keep the last answer
        _hosts_exist = SandboxHost.objects.exists()
    return _hosts_exist


def host_of(session: AgentSession) -> SandboxHost | None:
    """The session's host, pinned now when it has none (cached on the instance for this tick)."""
    if not hasattr(session, CACHE):
        if not session.has_sandbox:
            return None  # no workspace (the wire's environment none): never pinned
        if not _any_host():
            return None  # no host exists, so no placement can (a placement protects its host)
        setattr(session, CACHE, session_pin(session=session))
    host: SandboxHost | None = getattr(session, CACHE)
    return host


def workspace_is_local(session: AgentSession) -> bool:
    host = host_of(session)
    return host is None or host.name == settings.AGENTOPS_WORKSPACE_HOST


def tool_queue_for(step_id: str) -> str | None:
    # One query for the step, its session and, when pinned, its placement and host.
    step = Step.objects.select_related("session__placement__host").filter(pk=step_id).first()
    if step is None:
        return None
    if hasattr(step.session, "placement"):
        setattr(step.session, CACHE, step.session.placement.host)
    host = host_of(step.session)
    if host is None:
        return None
    if host.status != SandboxHost.Status.ONLINE:
        step_host_unavailable(step=step, host=host)  # the call waits in its host's queue, visibly
    if host.kind == SandboxHost.Kind.RUNNER:
        runner_wake(host.name, step_id)  # its long-poll claims the step in the database
        return ""
    return host.queue


def preview_elsewhere(step: Step) -> None:
    host = host_of(step.session)
    if host is not None and host.kind == SandboxHost.Kind.HOSTED:
        dispatch.host_task_enqueue(PREVIEW_TASK, [str(step.id)], queue=host.queue)


def recover_elsewhere(step: Step) -> str | None:
    """An interrupted tool step of a session whose workspace only its host may open: ask that host
    for the manifest check (online), wait for it to return (offline), or, when the check or the
    wait ran out, hand the step to a reviewer (in doubt). Retries stay the host's decision."""
    host = host_of(step.session)
    if host is None or host.name == settings.AGENTOPS_WORKSPACE_HOST:
        return None
    if step.lease_owner.startswith((CHECKING, AWAITING)):
        note = (f"Sandbox host {host.name} did not return within {settings.AGENTOPS_HOST_GIVE_UP_SECONDS:.0f} s"
                if step.lease_owner.startswith(AWAITING) else
                f"Sandbox host {host.name} did not answer the manifest check")
        return _in_doubt(step, note + "; whether the workspace changed is unknown. A reviewer decides.")
    fresh = host.last_heartbeat_at is not None and (
        timezone.now() - host.last_heartbeat_at).total_seconds() < settings.AGENTOPS_HOST_OFFLINE_SECONDS
    if host.status == SandboxHost.Status.ONLINE and fresh:
        manifest_check_request(step=step, host=host)
        return "manifest_check"
    return step_await_host(step=step, host=host)


def install() -> None:
    hosting.hooks.workspace_is_local = workspace_is_local
    hosting.hooks.preview_elsewhere = preview_elsewhere
    hosting.hooks.recover_elsewhere = recover_elsewhere
    dispatch.tool_queue_for = tool_queue_for
