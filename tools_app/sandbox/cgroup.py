"""A pids cgroup per command: the bound on processes that RLIMIT_NPROC cannot give.

RLIMIT_NPROC counts every process of the sandbox uid, shared by all sandboxes at once, so the
per-command bound on processes comes from a pids cgroup when the host offers one.
"""

import contextlib
import logging
import os
import signal
import time
import uuid

logger = logging.getLogger(__name__)

_CGROUP_CANDIDATES = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")


def _find_cgroup_parent() -> str | None:
    """A writable pids-cgroup directory for per-command child cgroups, or None."""
    if os.geteuid() != 0:
        return None
    for base in _CGROUP_CANDIDATES:
        if not os.path.exists(os.path.join(base, "pids.max")) and not os.path.exists(
                os.path.join(base, "cgroup.procs")):
            continue
        if base == "/sys/fs/cgroup":  # cgroup v2: needs the pids controller enabled for children
            try:
                with open(os.path.join(base, "cgroup.controllers")) as fh:
                    if "pids" not in fh.read().split():
                        continue
            except OSError:
                continue
        parent = os.path.join(base, "agentops-sandbox")
        try:
            os.makedirs(parent, exist_ok=True)
            if base == "/sys/fs/cgroup":
                with open(os.path.join(parent, "cgroup.subtree_control"), "w") as fh:
                    fh.write("+pids")
            probe = os.path.join(parent, f"probe-{uuid.uuid4().hex}")
            os.mkdir(probe)
            ok = os.path.exists(os.path.join(probe, "pids.max"))
            os.rmdir(probe)
        except OSError:
            continue
        if ok:
            return parent
    return None


_cgroup_parent_value: list[str | None] = []


def cgroup_parent() -> str | None:
    """The parent of the per-command cgroups, looked for once per process; None when there is none."""
    if not _cgroup_parent_value:
        _cgroup_parent_value.append(_find_cgroup_parent())
    return _cgroup_parent_value[0]


class PidsCgroup:
    """One command's cgroup under ``parent``, allowing ``max_processes`` at once."""

    def __init__(self, parent: str, max_processes: int) -> None:
        self.path = os.path.join(parent, uuid.uuid4().hex)
        os.mkdir(self.path)
        with open(os.path.join(self.path, "pids.max"), "w") as fh:
            fh.write(str(max_processes))

    @property
    def procs_file(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def limit_hit(self) -> bool:
        try:
            with open(os.path.join(self.path, "pids.events")) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "max" and int(value) > 0:
                        return True
        except (OSError, ValueError):
            pass
        return False

    def kill_all(self) -> None:
        for _ in range(50):
            try:
                with open(self.procs_file) as fh:
                    pids = [int(line) for line in fh if line.strip()]
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill_all()
        for _ in range(100):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)  # the last killed processes are still being reaped
        logger.warning("could not remove sandbox cgroup %s", self.path)
