"""Per-session workspaces and safe access to paths inside them.

The worker runs as root, and agents can plant symlinks in their workspace with any command, so
every host-side access (read_file, write_file, manifests) resolves the path, checks that it stays
inside the workspace, then walks it one component at a time with ``O_NOFOLLOW``: a symlink swapped
in between the check and the open makes the open fail instead of escaping.
"""

import errno
import hashlib
import os
import re
import shutil
import stat
from pathlib import Path
from typing import NamedTuple
from uuid import UUID, uuid4

from django.conf import settings

DEFAULT_SANDBOX_UID = 65534
SANDBOX_MOUNT = "/workspace"
_SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_HASH_CHUNK_BYTES = 1024 * 1024


class PathDenied(Exception):
    """The path leaves the workspace (absolute, ``..``, or a symlink pointing out)."""

    code = "denied"


class NotARegularFile(OSError):
    """The path is a directory, FIFO, socket or device: only regular files are read or hashed."""


def sandbox_ids() -> tuple[int, int]:
    """The uid/gid that owns workspaces and runs sandboxed commands.

    bwrap must never run as real root; when the worker is not root it already is unprivileged,
    and it cannot chown to anyone else, so its own ids are used.
    """
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    uid = int(getattr(settings, "AGENTOPS_SANDBOX_UID", DEFAULT_SANDBOX_UID))
    gid = int(getattr(settings, "AGENTOPS_SANDBOX_GID", uid))
    if uid == 0 or gid == 0:
        raise ValueError("AGENTOPS_SANDBOX_UID/GID must not be 0: the sandbox never runs as root")
    return uid, gid


def workspace_root() -> Path:
    root = Path(settings.AGENTOPS_WORKSPACE_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    # 0711: the sandbox uid must traverse the root to reach its bind source, but never list it.
    if stat.S_IMODE(root.stat().st_mode) != 0o711 and os.geteuid() == 0:
        root.chmod(0o711)
    return root.resolve()


def workspace_for(session_id: str | UUID) -> Path:
    """Return (creating it if needed) the workspace of one session, owned by the sandbox uid."""
    name = str(session_id)
    if not _SESSION_ID_RE.match(name) or ".." in name:
        raise ValueError(f"not a valid session id for a workspace: {name!r}")
    workspace = workspace_root() / name
    try:
        workspace.mkdir(mode=0o700)
    except FileExistsError:
        if workspace.is_symlink() or not workspace.is_dir():
            raise ValueError(f"{workspace} exists and is not a directory") from None
    uid, gid = sandbox_ids()
    st = workspace.lstat()
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(workspace, uid, gid, follow_symlinks=False)
    if stat.S_IMODE(st.st_mode) != 0o700:
        workspace.chmod(0o700)
    return workspace


def workspace_retire(workspace: Path) -> Path | None:
    """Move a workspace out of the way, atomically (a rename in the workspace root), so that a
    new one can be created under the same name at once. Returns where it went, for
    ``workspace_purge``; None when there was nothing there. Refuses a path outside the root."""
    root = workspace_root().resolve()
    path = Path(workspace)
    if path.is_symlink() or path.resolve().parent != root:
        raise ValueError(f"{workspace} is not a workspace under {root}")
    retired = root / f".retired-{path.name}-{uuid4().hex[:8]}"
    try:
        os.rename(path, retired)
    except FileNotFoundError:
        return None
    return retired


def workspace_purge(retired: Path) -> None:
    """Delete a retired workspace and everything in it (symlinks are removed, never followed)."""
    shutil.rmtree(retired, ignore_errors=True)


def workspace_relpath(path: str) -> str:
    """Normalise an agent-supplied path to a relative path inside the workspace.

    Accepts ``a/b``, ``./a/b`` and ``/workspace/a/b`` (what the agent sees inside the sandbox).
    Raises PathDenied for other absolute paths and for any ``..`` component.
    """
    if "\x00" in path:
        raise PathDenied("the path contains a NUL byte")
    text = path.strip()
    if text == SANDBOX_MOUNT or text.startswith(SANDBOX_MOUNT + "/"):
        text = text[len(SANDBOX_MOUNT):]
    elif text.startswith("/"):
        raise PathDenied(f"absolute paths outside {SANDBOX_MOUNT} are not allowed: {path!r}")
    parts = [part for part in text.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise PathDenied(f"'..' is not allowed in paths: {path!r}")
    return "/".join(parts)


def resolve_in_workspace(workspace: Path, relpath: str) -> str:
    """Resolve symlinks; return the relative path of the target, or raise PathDenied if it leaves."""
    real_ws = os.path.realpath(workspace)
    target = os.path.realpath(os.path.join(real_ws, relpath))
    if target != real_ws and not target.startswith(real_ws + os.sep):
        raise PathDenied(f"{relpath!r} resolves outside the workspace (a symlink leaves it)")
    rel = os.path.relpath(target, real_ws)
    return "" if rel == "." else rel


def open_beneath(workspace: Path, relpath: str, flags: int, mode: int = 0o644, *,
                 create_parents: bool = False) -> int:
    """Open ``relpath`` inside ``workspace`` without following any symlink out of it. Returns an fd.

    ``relpath`` must come from workspace_relpath(). Symlinks inside the workspace that stay inside
    are followed (they are resolved first); the walk itself follows none.
    """
    rel = resolve_in_workspace(workspace, relpath)
    parts = rel.split(os.sep) if rel else []
    dirfd = os.open(os.path.realpath(workspace), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not parts:
            return os.dup(dirfd)
        uid, gid = sandbox_ids()
        for part in parts[:-1]:
            dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                next_fd = os.open(part, dir_flags, dir_fd=dirfd)
            except FileNotFoundError:
                if not create_parents:
                    raise
                os.mkdir(part, 0o755, dir_fd=dirfd)
                os.chown(part, uid, gid, dir_fd=dirfd, follow_symlinks=False)
                next_fd = os.open(part, dir_flags, dir_fd=dirfd)
            os.close(dirfd)
            dirfd = next_fd
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathDenied(f"{relpath!r} is a symlink that changed while it was opened") from exc
        raise
    finally:
        os.close(dirfd)


class FileDigest(NamedTuple):
    size: int
    sha256: str


def file_sha256(fd: int) -> FileDigest:
    """Size and SHA-256 of the regular file open on ``fd``, read from its start. The caller closes ``fd``.

    Raises NotARegularFile for anything else. Open the file with open_beneath(..., os.O_RDONLY |
    os.O_NONBLOCK): the agent controls the workspace, and a FIFO must not hang the worker.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotARegularFile(f"not a regular file (mode {stat.filemode(st.st_mode)})")
    os.lseek(fd, 0, os.SEEK_SET)
    digest = hashlib.sha256()
    while chunk := os.read(fd, _HASH_CHUNK_BYTES):
        digest.update(chunk)
    return FileDigest(st.st_size, digest.hexdigest())


def workspace_file_sha256(workspace: Path | str, relpath: str) -> FileDigest:
    """Size and SHA-256 of a regular file inside ``workspace``, opened with open_beneath().

    ``relpath`` comes from workspace_relpath() or a manifest. Raises PathDenied when it leads out
    of the workspace, NotARegularFile for a directory or special file, OSError when it is gone.
    """
    fd = open_beneath(Path(workspace), relpath, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return file_sha256(fd)
    finally:
        os.close(fd)


def workspace_usage(workspace: Path) -> int:
    """Bytes the workspace takes on disk (allocated blocks, so a sparse file counts what it
    holds), symlinks not followed. The quota is checked with it after every command: the
    workspace is the one writable filesystem inside the sandbox that is not a capped tmpfs."""
    total = 0
    stack = [str(workspace)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
    return total
