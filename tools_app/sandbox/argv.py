"""The command line of one sandboxed command.

The process chain is ``/bin/sh`` (as root: join a pids cgroup, set rlimits) -> ``setpriv`` (drop
to the sandbox uid: bwrap must never run as real root) -> ``bwrap`` -> ``/bin/sh -c COMMAND`` as
pid 1 of fresh user, pid, net, ipc, uts and cgroup namespaces. Each step execs the next, so
the Popen pid is bwrap's and killing its process group plus the cgroup ends everything: bwrap's
child dies with it (--die-with-parent), and with it the whole pid namespace.
"""

import os
import re
from collections.abc import Mapping
from pathlib import Path

from .cgroup import PidsCgroup
from .policy import SandboxPolicy
from .workspace import SANDBOX_MOUNT, sandbox_ids

SETPRIV = "/usr/bin/setpriv"
HOST_SH = "/bin/sh"
# The environment inside the sandbox (bwrap starts from --clearenv).
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": SANDBOX_MOUNT, "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", "USER": "sandbox", "LOGNAME": "sandbox", "SHELL": "/bin/sh"}
# Host files a command needs to run common tools; none of them hold secrets.
_ETC_RO_BINDS = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types")
_ETC_NET_BINDS = ("/etc/resolv.conf", "/etc/hosts", "/etc/ssl", "/etc/ca-certificates", "/etc/nsswitch.conf")
# A command's extra environment (secrets): a file bound from a pipe and sourced before the command,
# so no value is ever on a command line (any host user reads /proc/<pid>/cmdline).
ENV_FILE = "/run/agentops/env"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
ENV_MAX_BYTES = 60_000
_SOURCE_ENV = 'set -a; . "$0" || exit 125; set +a; exec /bin/sh -c "$1"'
# Exit status of the launcher itself when it cannot set up limits (distinct from the command's).
LAUNCHER_FAILED = 125
# Joins the cgroups (when given: cgroup.procs files separated by spaces), sets the limits, drops
# nothing yet; then execs the rest of argv.
# ulimit units in dash: -v KiB, -f 512-byte blocks. CPU: soft then hard, so SIGXCPU comes first.
_LAUNCHER = (
    'for procs in $1; do echo $$ > "$procs" || exit 125; done; '
    'ulimit -c 0 && ulimit -St "$2" && ulimit -Ht "$3" && ulimit -v "$4" && ulimit -f "$5" '
    '&& ulimit -n "$6" && ulimit -p "$7" || exit 125; '
    'shift 7; exec "$@"'
)


def bwrap_args(bwrap: str, *, workspace: Path, cwd_rel: str, policy: SandboxPolicy, passwd_fd: int,
               group_fd: int, status_fd: int, seccomp_fd: int, command: str, env_fd: int | None = None) -> list[str]:
    # --disable-userns: the command cannot make a nested user namespace (where it would be uid 0
    # with every capability over it); the seccomp filter refuses unshare/clone flags besides.
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--as-pid-1", "--clearenv", "--json-status-fd", str(status_fd), "--seccomp", str(seccomp_fd)]
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
             # bwrap's /dev is a tmpfs without a size cap, /dev/shm a directory on it: a capped
             # tmpfs on /dev/shm, and /dev itself read-only (its device nodes still work).
             "--size", str(policy.tmp_size_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
             "--chdir", f"{SANDBOX_MOUNT}/{cwd_rel}".rstrip("/"),
             "--hostname", "sandbox"]
    for key, value in SANDBOX_ENV.items():
        args += ["--setenv", key, value]
    if env_fd is not None:
        args += ["--ro-bind-data", str(env_fd), ENV_FILE]
    args += command_argv(command, ENV_FILE if env_fd is not None else None)
    return args


def command_argv(command: str, env_file: str | None) -> list[str]:
    """``/bin/sh -c command``, after sourcing ``env_file`` (exported) when there is one."""
    if env_file is None:
        return ["/bin/sh", "-c", command]
    return ["/bin/sh", "-c", _SOURCE_ENV, env_file, command]


def env_file_data(env: Mapping[str, str]) -> bytes:
    """``NAME='value'`` lines for ``.``; ValueError for a name that is not a shell variable."""
    lines = []
    for name, value in env.items():
        if not ENV_NAME.match(name):
            raise ValueError(f"{name[:40]!r} is not a valid environment variable name")
        lines.append(f"{name}='" + value.replace("'", "'\\''") + "'\n")
    data = "".join(lines).encode()
    if len(data) > ENV_MAX_BYTES:  # the pipe is written before the command starts: it must not block
        raise ValueError(f"the command environment is {len(data)} bytes; the limit is {ENV_MAX_BYTES}")
    return data


def launcher_args(policy: SandboxPolicy, cgroup: PidsCgroup | None, has_cgroup_parent: bool) -> list[str]:
    # With a per-command pids cgroup, RLIMIT_NPROC is only a uid-wide backstop (it is shared by every
    # sandbox running at once); without one it is the only bound on processes.
    nproc = max(policy.max_processes * 16, 4096) if has_cgroup_parent else policy.max_processes
    return [HOST_SH, "-c", _LAUNCHER, "agentops-sandbox", cgroup.procs_file if cgroup else "",
            str(policy.cpu_seconds), str(policy.cpu_seconds + 1), str(max(policy.memory_bytes // 1024, 1)),
            str(max(policy.file_size_bytes // 512, 1)), str(policy.max_open_files), str(nproc)]


def drop_privileges_args() -> list[str]:
    if os.geteuid() != 0:
        return []
    uid, gid = sandbox_ids()
    return [SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


def data_fd(data: bytes) -> int:
    """A pipe's read end holding ``data`` (for bwrap's --ro-bind-data)."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, data)  # a few hundred bytes: far below the pipe buffer, never blocks
    finally:
        os.close(write_fd)
    return read_fd


def passwd_data(home: str = SANDBOX_MOUNT) -> tuple[bytes, bytes]:
    uid, gid = sandbox_ids()
    passwd = f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{uid}:{gid}:sandbox:{home}:/bin/sh\n"
    passwd += "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n" if uid != 65534 else ""
    group = f"root:x:0:\nsandbox:x:{gid}:\n"
    return passwd.encode(), group.encode()
