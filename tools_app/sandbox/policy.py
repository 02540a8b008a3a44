"""What a sandboxed command may use, and what it reports back."""

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Network = Literal["none", "host"]

MIB = 1024 * 1024


class SandboxUnavailable(RuntimeError):
    """No sandbox backend works and the unsafe development backend is not allowed."""

    code = "sandbox_error"


@dataclass(frozen=True)
class SandboxPolicy:
    """Limits for one command. Part of the approval hash: what a reviewer approved is what runs."""

    network: Network = "none"
    timeout_seconds: float = 60
    cpu_seconds: int = 60
    memory_bytes: int = 1024 * MIB  # RLIMIT_AS: address space, not resident memory
    file_size_bytes: int = 256 * MIB
    max_open_files: int = 256
    max_processes: int = 128
    output_cap_bytes: int = 64 * 1024  # kept per stream: half head, half tail
    # Past this much output the command is killed: draining 10 GB of `yes` only burns CPU.
    output_limit_bytes: int = 32 * MIB
    tmp_size_bytes: int = 64 * MIB  # each of /tmp and /dev/shm (capped tmpfs)
    workspace_quota_bytes: int = 1024 * MIB  # watched while each command runs, and after it (bubblewrap.QuotaWatch)

    def __post_init__(self) -> None:
        if self.network not in ("none", "host"):
            raise ValueError(f"network must be 'none' or 'host', not {self.network!r}")
        for name in ("timeout_seconds", "cpu_seconds", "memory_bytes", "file_size_bytes", "max_open_files",
                     "max_processes", "output_cap_bytes", "output_limit_bytes", "tmp_size_bytes",
                     "workspace_quota_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CommandResult:
    """The outcome of one sandboxed command.

    ``error_code`` is empty when the command ran to its end (whatever its exit code); otherwise one of
    ``timeout``, ``cancelled``, ``limit_exceeded``, ``sandbox_error``.
    """

    exit_code: int | None
    stdout: str
    stderr: str
    duration_ms: float
    backend: str
    error_code: str = ""
    error_message: str = ""
    stdout_bytes: int = 0  # total produced, including what was cut
    stderr_bytes: int = 0
    stdout_truncated_bytes: int = 0
    stderr_truncated_bytes: int = 0
    limits_hit: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error_code and self.exit_code == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
