"""Where a session's workspace lives: the hooks the sandbox hosts plug into the engine.

One machine (``make run``, no hosts registered): every process shares the workspace root, and the
defaults below keep the engine as it was. ``hosts_app`` replaces them in ``AppConfig.ready()``: a
session pinned to a host whose filesystem this process does not share is never opened here; the
write-diff for its reviewer and the manifest check of its interrupted command are asked of that
host (its Celery queue ``sandbox.<host>``, or its runner).
"""

from collections.abc import Callable
from dataclasses import dataclass

from sessions_app.models import AgentSession, Step


def _here(session: AgentSession) -> bool:
    return True


def _nothing(step: Step) -> None:
    return None


def _not_mine(step: Step) -> str | None:
    return None


@dataclass
class HostingHooks:
    # May this process open the session's workspace? (inline read-only tools, previews, manifests)
    workspace_is_local: Callable[[AgentSession], bool] = _here
    # Ask the session's host for the write-diff of a step a reviewer is asked about (after commit).
    preview_elsewhere: Callable[[Step], None] = _nothing
    # The sweeper's decision for an interrupted step of a session whose workspace is elsewhere
    # (call inside the sweeper's transaction, the session locked); None: decide here as before.
    recover_elsewhere: Callable[[Step], str | None] = _not_mine


hooks = HostingHooks()
