"""The seccomp filter every sandboxed command runs under (``bwrap --seccomp FD``).

Built once per process with libseccomp (through ``pyseccomp``) and exported as a BPF program.
Everything is allowed except the calls a build or test command never needs and an escape or a
kernel exploit usually does: new namespaces (``unshare``, ``setns``, ``clone``/``clone3`` with
namespace flags), mounts (``mount``, the new mount API, ``pivot_root``), tracing other
processes (``ptrace``, ``process_vm_*``), ``bpf``, the kernel keyring, ``perf_event_open``,
``userfaultfd``, kernel modules, kexec, reboot, swap, quotas, ``open_by_handle_at`` (the
classic container escape), ``io_uring`` (a large kernel surface with its own escapes). Each fails
with EPERM, as on a host that forbids it, so a tool can report the refusal; ``clone3`` answers
ENOSYS so the C library falls back to ``clone``, whose flags the filter can read. Calls of another
architecture (32-bit ``int 0x80`` on x86-64) kill the process: libseccomp's default.
"""

import errno
import os
import threading

DENIED = (
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "bpf", "keyctl", "add_key", "request_key", "perf_event_open", "userfaultfd",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "quotactl", "acct", "syslog", "lookup_dcookie",
    "open_by_handle_at", "name_to_handle_at", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "personality", "vhangup", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
)
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
CLONE_NEWTIME = 0x00000080  # shares its bit with CSIGNAL's range in clone(), so only refused via unshare

_lock = threading.Lock()
_program: list[bytes] = []


def _build() -> bytes:
    import pyseccomp as seccomp

    flt = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED:
        try:
            flt.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (OSError, ValueError, RuntimeError):  # a call this kernel/arch does not have
            continue
    for flag in (1 << bit for bit in range(32) if CLONE_NAMESPACE_FLAGS & (1 << bit)):
        flt.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    flt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    read_fd, write_fd = os.pipe()
    try:
        with os.fdopen(write_fd, "wb", closefd=True) as out:
            flt.export_bpf(out)
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(read_fd)
    return b"".join(chunks)


def seccomp_program() -> bytes:
    """The compiled BPF program (built once per process)."""
    with _lock:
        if not _program:
            _program.append(_build())
        return _program[0]


def seccomp_fd() -> int:
    """A file descriptor to read the program from, for ``bwrap --seccomp``: a memfd at offset 0."""
    program = seccomp_program()
    fd = os.memfd_create("agentops-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
