"""An MCP stdio transport whose server process runs inside the bubblewrap sandbox.

The SDK's ``stdio_client`` starts a plain process; this one builds the same launcher -> setpriv ->
bwrap chain as ``run_command`` (``tools_app.sandbox``: fresh namespaces, read-only system, only
the workspace writable, a pids/memory cgroup, rlimits, no network unless the server's policy
says ``host``), passes bwrap its data fds, and speaks newline-delimited JSON-RPC over the pipes.

Inside, the worker's Python packages are visible read-only at ``SITE_MOUNT`` (``PYTHONPATH``), so a
server written with the ``mcp`` SDK runs under the system ``python3``; they hold code, no secrets.
A line on stdout that is not JSON-RPC ends the connection and is reported as a malformed reply.

The server holds secrets the agent must not see (its env), and the workspace is the agent's: no
code or configuration the agent can write may run in it. So its HOME and working directory are
``SERVER_HOME`` on the sandbox's private /tmp (a workspace as HOME put Python's user site, with
its ``usercustomize.py`` and ``.pth`` files, and npm's ``~/.npmrc`` there; as the working directory,
``.npmrc``, ``node_modules/.bin`` and other project files), Python's user site is off
(``PYTHONNOUSERSITE``) and ``PYTHONSAFEPATH`` keeps the working directory off ``sys.path`` for
``-c``/``-m``. The workspace stays at /workspace (read-write) for servers that work on its files.

Host directories (site-packages, the server's ``mounts``) under a directory the sandbox uid
cannot traverse (a checkout under a 0700 home): bwrap, already the sandbox uid, cannot open them
(and ``--ro-bind-fd`` of a root-opened fd is refused inside its user namespace). A root worker
therefore starts the chain in a private mount namespace (``unshare --mount``: the host's mount
table is untouched) where it bind-mounts exactly those directories onto a fresh tmpfs under the
workspace root, and bwrap binds them from there. Only the ancestors' modes are bypassed, for the
directories an admin named: each file's own mode still applies to the sandbox uid. Passing the
fd into the sandbox instead was rejected: ``..`` from a directory outside its root walks the
whole host filesystem.
"""

import contextlib
import dataclasses
import functools
import os
import re
import shlex
import signal
import subprocess
import sysconfig
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import types
from mcp.shared.message import SessionMessage

from tools_app.builtin.command import policy_for
from tools_app.sandbox import SandboxUnavailable
from tools_app.sandbox.argv import HOST_SH, bwrap_args, data_fd, drop_privileges_args, launcher_args, passwd_data
from tools_app.sandbox.backend import ensure_backend
from tools_app.sandbox.cgroup import PidsCgroup, cgroup_parent
from tools_app.sandbox.policy import SandboxPolicy
from tools_app.sandbox.process import LAUNCHER_ENV
from tools_app.sandbox.seccomp import seccomp_fd
from tools_app.sandbox.workspace import workspace_root

SITE_MOUNT = "/opt/agentops/site-packages"
# The server's HOME and working directory: on its sandbox's own /tmp tmpfs, never in the workspace.
SERVER_HOME = "/tmp/home"
# Set after SANDBOX_ENV (bwrap applies --setenv in order); the server's own env comes after these.
SERVER_ENV = {"HOME": SERVER_HOME, "PYTHONPATH": SITE_MOUNT, "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1",
              "PYTHONDONTWRITEBYTECODE": "1"}
STDERR_KEEP = 4000
UNSHARE = "/usr/bin/unshare"
# A long-lived server's CPU budget (RLIMIT_CPU, for its whole life; past it the kernel ends it and
# the next call starts a new one): a per-call server's is its call's deadline.
LONG_LIVED_CPU_SECONDS = 3600
# Run as root by unshare in its private mount namespace: a tmpfs on $1, then each host directory
# up to "--" bind-mounted on $1/<i> (read-only), then exec the rest (the launcher chain).
_STAGE = ('b="$1"; shift; mount -t tmpfs -o size=64k,mode=0755,nosuid,nodev agentops-binds "$b" || exit 125; '
          'i=0; while [ "$1" != "--" ]; do mkdir "$b/$i" && mount --bind "$1" "$b/$i" '
          '&& mount -o remount,bind,ro,nosuid,nodev "$b/$i" || exit 125; i=$((i+1)); shift; done; '
          'shift; exec "$@"')


@dataclass
class StdioTrouble:
    """What the transport saw go wrong, for the caller's error message. ``closed`` (when given)
    is set once the server's stdout ended: a long-lived server that died is not reused."""

    malformed: str = ""
    stderr: bytearray = field(default_factory=bytearray)
    closed: anyio.Event | None = None

    def stderr_tail(self) -> str:
        return self.stderr[-STDERR_KEEP:].decode("utf-8", "replace").strip()


ENV_FILE = "/run/agentops/env"
ENV_MAX_BYTES = 16 * 1024  # under a pipe's buffer: data_fd writes it at once
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_script(env: dict[str, str]) -> bytes:
    """The server's environment as a shell script sourced inside the sandbox. Passed through a
    pipe (bwrap's --ro-bind-data), never on a command line: a resolved secret must not show in
    ``ps`` or /proc/<pid>/cmdline on the host."""
    lines = []
    if sum(len(k) + len(v) for k, v in env.items()) > ENV_MAX_BYTES:
        raise ValueError(f"the server's environment is over {ENV_MAX_BYTES} bytes")
    for key, value in env.items():
        if not ENV_NAME_RE.match(key):
            raise ValueError(f"not an environment variable name: {key!r}")
        lines.append(f"export {key}={shlex.quote(value)}")
    return ("\n".join(lines) + "\n").encode()


def server_policy(*, timeout: int, network: str, long_lived: bool) -> SandboxPolicy:
    policy = policy_for(timeout_seconds=timeout, network=network)
    return dataclasses.replace(policy, cpu_seconds=LONG_LIVED_CPU_SECONDS) if long_lived else policy


@functools.cache
def can_stage_binds() -> bool:
    """Whether this (root) worker can make a private mount namespace; probed once per process."""
    if os.geteuid() != 0 or not os.path.exists(UNSHARE):
        return False
    probe = subprocess.run([UNSHARE, "--mount", "--propagation", "private", "/bin/true"], capture_output=True,
                           timeout=10, check=False)
    return probe.returncode == 0


def bind_stage_dir() -> Path:
    """The mountpoint of the private tmpfs (root-owned, under the 0711 workspace root)."""
    path = workspace_root() / ".mcp-binds"
    path.mkdir(mode=0o755, exist_ok=True)
    return path


def _host_binds(mounts: list[str]) -> list[tuple[str, str]]:
    """(host directory, path in the sandbox): site-packages, then the server's mounts."""
    binds = [(sysconfig.get_paths()["purelib"], SITE_MOUNT)]
    for mount in mounts:
        real = os.path.realpath(str(mount))
        if not os.path.isabs(str(mount)) or not os.path.isdir(real):
            raise ValueError(f"mount {str(mount)[:200]!r} is not an absolute path to a directory")
        binds.append((real, str(mount)))
    return binds


def _sandbox_argv(bwrap: str, *, argv: list[str], workspace: Path, mounts: list[str], policy: SandboxPolicy,
                  fds: dict[str, int], cgroup: PidsCgroup | None, has_parent: bool) -> list[str]:
    args = bwrap_args(bwrap, workspace=workspace, cwd_rel="", policy=policy, passwd_fd=fds["passwd"],
                      group_fd=fds["group"], status_fd=fds["status"], seccomp_fd=fds["seccomp"],
                      command=f". {ENV_FILE} && exec {shlex.join(argv)}")
    binds = _host_binds(mounts)
    prefix: list[str] = []
    if can_stage_binds():
        stage = str(bind_stage_dir())
        prefix = [UNSHARE, "--mount", "--propagation", "private", HOST_SH, "-c", _STAGE, "agentops-binds", stage,
                  *(source for source, _ in binds), "--"]
        binds = [(f"{stage}/{i}", target) for i, (_, target) in enumerate(binds)]
    # bwrap_args ends with /bin/sh -c COMMAND: the server's binds and environment go before it.
    extra = ["--dir", SERVER_HOME, "--chdir", SERVER_HOME, "--ro-bind-data", str(fds["env"]), ENV_FILE]
    for key, value in SERVER_ENV.items():
        extra += ["--setenv", key, value]
    for source, target in binds:
        extra += ["--ro-bind", source, target]
    return prefix + launcher_args(policy, cgroup, has_parent) + drop_privileges_args() + args[:-3] + extra + args[-3:]


@contextlib.asynccontextmanager
async def sandboxed_stdio(*, argv: list[str], workspace: Path, mounts: list[str], env: dict[str, str],
                          network: str, timeout: int, trouble: StdioTrouble, long_lived: bool = False) -> AsyncIterator[
        tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]]:
    """Start the server in the sandbox; yield the (read, write) streams a ClientSession takes.
    The whole process tree is killed on exit, however the block ends (deadline, error, success)."""
    backend, status = ensure_backend()
    if backend is None or backend.bwrap is None:
        raise SandboxUnavailable(f"MCP stdio servers need bubblewrap: {status.get('detail', 'no backend')}")
    script = env_script(env)  # refuses a bad environment before anything is created
    policy = server_policy(timeout=timeout, network=network, long_lived=long_lived)
    parent = cgroup_parent()
    cgroup = PidsCgroup(parent, 128, policy.memory_bytes) if parent else None
    status_read, status_write = os.pipe()
    process: anyio.abc.Process | None = None
    try:
        passwd, group = passwd_data(home=SERVER_HOME)
        fds = {"passwd": data_fd(passwd), "group": data_fd(group), "seccomp": seccomp_fd(), "status": status_write,
               "env": data_fd(script)}
        try:
            full = _sandbox_argv(backend.bwrap, argv=argv, workspace=Path(os.path.realpath(workspace)),
                                 mounts=mounts, policy=policy, fds=fds, cgroup=cgroup,
                                 has_parent=parent is not None)
            process = await anyio.open_process(full, cwd="/", env=LAUNCHER_ENV, start_new_session=True,
                                               pass_fds=tuple(fds.values()))
        finally:
            for fd in fds.values():
                os.close(fd)
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_stdout, process, read_writer, trouble)
            tg.start_soon(_write_stdin, process, write_reader)
            tg.start_soon(_read_stderr, process, trouble)
            try:
                yield read_stream, write_stream
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if process is not None:
                _kill(process, cgroup)
                with contextlib.suppress(Exception):
                    await process.aclose()
            os.close(status_read)
            if cgroup is not None:
                cgroup.remove()


def _kill(process: anyio.abc.Process, cgroup: PidsCgroup | None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # start_new_session: the group is the whole chain
    if cgroup is not None:
        cgroup.kill_all()


async def _read_stdout(process: anyio.abc.Process, out: MemoryObjectSendStream[SessionMessage | Exception],
                       trouble: StdioTrouble) -> None:
    try:
        await _pump_stdout(process, out, trouble)
    finally:
        if trouble.closed is not None:
            trouble.closed.set()


async def _pump_stdout(process: anyio.abc.Process, out: MemoryObjectSendStream[SessionMessage | Exception],
                       trouble: StdioTrouble) -> None:
    assert process.stdout is not None
    buffer = b""
    async with out:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for chunk in process.stdout:
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        message = types.JSONRPCMessage.model_validate_json(line)
                    except ValueError:
                        # Not JSON-RPC: the conversation cannot be trusted any further. Closing the
                        # stream fails the pending request at once (no wait for the deadline).
                        trouble.malformed = line[:300].decode("utf-8", "replace")
                        return
                    await out.send(SessionMessage(message))


async def _write_stdin(process: anyio.abc.Process, messages: MemoryObjectReceiveStream[SessionMessage]) -> None:
    assert process.stdin is not None
    async with messages:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for message in messages:
                data = message.message.model_dump_json(by_alias=True, exclude_none=True)
                await process.stdin.send((data + "\n").encode())


async def _read_stderr(process: anyio.abc.Process, trouble: StdioTrouble) -> None:
    assert process.stderr is not None
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        async for chunk in process.stderr:
            trouble.stderr += chunk
            del trouble.stderr[:-STDERR_KEEP]
