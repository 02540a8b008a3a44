"""A pids cgroup per command: the bound on processes that RLIMIT_NPROC cannot give; and a
memory cgroup: the bound on the resident memory of the whole tree that RLIMIT_AS cannot give.

RLIMIT_NPROC counts every process of the sandbox uid, shared by all sandboxes at once, so the
per-command bound on processes comes from a pids cgroup when the host offers one. RLIMIT_AS
bounds each process's address space, not their sum (128 processes of 1 GB each): a memory
cgroup (``memory.max`` on cgroup v2, ``memory.limit_in_bytes`` on v1) bounds the tree, and the
kernel's OOM killer ends a command past it. Without one, RLIMIT_AS is all there is.
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


MEMORY_V1 = "/sys/fs/cgroup/memory"


def _find_memory_parent() -> str | None:
    """A directory for per-command memory cgroups: under the pids parent on cgroup v2 (one
    process is in one cgroup there), a v1 memory hierarchy otherwise; None when neither works."""
    pids_parent = cgroup_parent()
    if pids_parent is not None and pids_parent.startswith("/sys/fs/cgroup/agentops-sandbox"):  # v2
        try:
            with open(os.path.join(pids_parent, "cgroup.subtree_control"), "w") as fh:
                fh.write("+memory")
            return pids_parent
        except OSError:
            return None
    if os.geteuid() != 0 or not os.path.exists(os.path.join(MEMORY_V1, "memory.limit_in_bytes")):
        return None
    parent = os.path.join(MEMORY_V1, "agentops-sandbox")
    try:
        os.makedirs(parent, exist_ok=True)
        probe = os.path.join(parent, f"probe-{uuid.uuid4().hex}")
        os.mkdir(probe)
        ok = os.path.exists(os.path.join(probe, "memory.limit_in_bytes"))
        os.rmdir(probe)
    except OSError:
        return None
    return parent if ok else None


_memory_parent_value: list[str | None] = []


def memory_cgroup_parent() -> str | None:
    """The parent of the per-command memory cgroups, looked for once per process."""
    if not _memory_parent_value:
        _memory_parent_value.append(_find_memory_parent())
    return _memory_parent_value[0]


class PidsCgroup:
    """One command's cgroup under ``parent``, allowing ``max_processes`` at once and, when
    ``memory_bytes`` is given and the host allows, that much memory for the whole tree."""

    def __init__(self, parent: str, max_processes: int, memory_bytes: int | None = None) -> None:
        self.path = os.path.join(parent, uuid.uuid4().hex)
        os.mkdir(self.path)
        with open(os.path.join(self.path, "pids.max"), "w") as fh:
            fh.write(str(max_processes))
        self.memory_path: str | None = None
        memory_parent = memory_cgroup_parent() if memory_bytes else None
        try:
            if memory_parent == parent:  # cgroup v2: the same cgroup
                with open(os.path.join(self.path, "memory.max"), "w") as fh:
                    fh.write(str(memory_bytes))
                with open(os.path.join(self.path, "memory.swap.max"), "w") as fh:
                    fh.write("0")
                self.memory_path = self.path
            elif memory_parent is not None:  # cgroup v1: a cgroup of the memory hierarchy
                path = os.path.join(memory_parent, uuid.uuid4().hex)
                os.mkdir(path)
                self.memory_path = path
                with open(os.path.join(path, "memory.limit_in_bytes"), "w") as fh:
                    fh.write(str(memory_bytes))
                # absent without swap accounting
                with contextlib.suppress(OSError), open(os.path.join(path, "memory.memsw.limit_in_bytes"), "w") as fh:
                    fh.write(str(memory_bytes))
        except OSError as exc:
            logger.warning("sandbox memory cgroup unavailable (%s): RLIMIT_AS only", exc)

    @property
    def procs_file(self) -> str:
        """The cgroup.procs files the launcher joins, separated by spaces."""
        files = [os.path.join(self.path, "cgroup.procs")]
        if self.memory_path is not None and self.memory_path != self.path:
            files.append(os.path.join(self.memory_path, "cgroup.procs"))
        return " ".join(files)

    def memory_limit_hit(self) -> bool:
        """Did the kernel kill a process of this command for want of memory?"""
        if self.memory_path is None:
            return False
        for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
            try:
                with open(os.path.join(self.memory_path, name)) as fh:
                    for line in fh:
                        field, _, value = line.partition(" ")
                        if field == key and int(value) > 0:
                            return True
            except (OSError, ValueError):
                continue
        return False

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
                with open(os.path.join(self.path, "cgroup.procs")) as fh:
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
        paths = [self.path] + ([self.memory_path] if self.memory_path not in (None, self.path) else [])
        for path in paths:
            _rmdir(str(path))


def _rmdir(path: str) -> None:
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # the last killed processes are still being reaped
    logger.warning("could not remove sandbox cgroup %s", path)
