"""Run one shell command in a per-session bubblewrap sandbox.

The pieces: ``backend`` picks and self-tests the bwrap binary, ``argv`` builds the launcher ->
setpriv -> bwrap command line, ``cgroup`` bounds its processes, ``process`` runs it and tells
what happened.
"""

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from .backend import ensure_backend, unreachable_ancestor
from .policy import CommandResult, SandboxPolicy, SandboxUnavailable
from .process import run_with_backend
from .progress import OutputBatcher
from .workspace import PathDenied, workspace_relpath, workspace_usage


def _prepare_cwd(workspace: Path, cwd: str) -> str:
    rel = workspace_relpath(cwd)
    real_ws = os.path.realpath(workspace)
    target = os.path.realpath(os.path.join(real_ws, rel))
    if target != real_ws and not target.startswith(real_ws + os.sep):
        raise PathDenied(f"cwd {cwd!r} leaves the workspace")
    if not os.path.isdir(target):
        raise FileNotFoundError(f"cwd {cwd!r} is not a directory in the workspace")
    return rel


def run_sandboxed(*, workspace: Path, command: str, cwd: str = ".", policy: SandboxPolicy,
                  should_cancel: Callable[[], bool] | None = None,
                  live: OutputBatcher | None = None, env: Mapping[str, str] | None = None) -> CommandResult:
    """Run ``command`` with ``/bin/sh -c`` in the sandbox, ``workspace`` mounted at /workspace.

    Raises SandboxUnavailable when no backend works (never falls back to an unsafe one silently),
    PathDenied / FileNotFoundError for a bad ``cwd``. Everything that happens to the command
    itself (timeout, limits, cancellation) is reported in the CommandResult, never raised. ``env``
    adds variables to the command's environment (a file bound from a pipe and sourced: no value
    is ever on a command line).
    """
    backend, status = ensure_backend()
    if backend is None:
        raise SandboxUnavailable(f"no working sandbox backend: {status['detail']}")
    blocked = unreachable_ancestor(Path(workspace).parent) if backend.bwrap else ""
    if blocked:
        raise SandboxUnavailable(f"the workspace {workspace} is not reachable by the sandbox uid: {blocked} lacks "
                                 "o+x (put AGENTOPS_WORKSPACE_ROOT under a traversable directory)")
    cwd_rel = _prepare_cwd(workspace, cwd)
    watch = QuotaWatch(workspace, policy.workspace_quota_bytes, should_cancel)
    result = run_with_backend(backend, workspace=Path(os.path.realpath(workspace)), command=command,
                              cwd_rel=cwd_rel, policy=policy, should_cancel=watch, live=live,
                              env=env)
    if watch.grown_to:
        result.error_code = "limit_exceeded"
        result.error_message = (f"the command was stopped: the workspace grew to {watch.grown_to} bytes, over its "
                                f"quota of {policy.workspace_quota_bytes} bytes")
    # After every command too, and never refused before one: a command that frees space (rm) must run.
    used = workspace_usage(workspace)
    if used > policy.workspace_quota_bytes:
        result.limits_hit.append("workspace")
        message = _over_quota(used, policy)
        if result.error_code in ("", "limit_exceeded"):
            result.error_code = "limit_exceeded"
            if message not in result.error_message:
                result.error_message = f"{result.error_message}; {message}" if result.error_message else message
    return result


class QuotaWatch:
    """The command's cancellation check, which also stops a command that grows the workspace past
    its quota while it runs (checking only after it ended let one command fill the host's disk at
    ~1 GB/s: an audit wrote 2.8 GB into a 1-GB workspace in two commands). The limit is the quota,
    or what the workspace held at the start when that was more (a command run to free space may
    shrink it, not grow it). The walk is timed: it runs at most every ``CHECK_SECONDS``, and
    never more often than twenty times its own duration (a workspace of many files)."""

    CHECK_SECONDS = 1.0

    def __init__(self, workspace: Path, quota: int, should_cancel: Callable[[], bool] | None) -> None:
        self.workspace, self.should_cancel = workspace, should_cancel
        self.limit = max(quota, workspace_usage(workspace))
        self.next_check = time.monotonic() + self.CHECK_SECONDS
        self.grown_to = 0

    def __call__(self) -> bool:
        if self.should_cancel is not None and self.should_cancel():
            return True
        now = time.monotonic()
        if now < self.next_check:
            return False
        used = workspace_usage(self.workspace)
        took = time.monotonic() - now
        self.next_check = time.monotonic() + max(self.CHECK_SECONDS, 20 * took)
        if used > self.limit:
            self.grown_to = used
            return True
        return False


def _over_quota(used: int, policy: SandboxPolicy) -> str:
    return (f"the workspace holds {used} bytes, over its quota of {policy.workspace_quota_bytes} bytes: "
            "free space before anything else")
