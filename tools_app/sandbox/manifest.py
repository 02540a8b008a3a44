"""Effect evidence: what a workspace held before a command, and what the command changed.

The engine stores the manifest taken before a mutating command. After a crash, recovery asks
workspace_changed_since(): unchanged means the command had no effect yet and may be retried;
changed means a blind retry could apply it twice, so a reviewer decides.
"""

import os
import stat
from pathlib import Path
from typing import Any

from .workspace import NotARegularFile, file_sha256

MANIFEST_VERSION = 1
HASH_MAX_BYTES = 16 * 1024 * 1024  # larger files are compared by size and mtime only
MAX_ENTRIES = 100_000  # past this the manifest is marked truncated and any comparison says "changed"


def _file_sha256(path: str) -> str | None:
    try:
        # O_NONBLOCK: a FIFO swapped in after lstat must not hang the worker. The walk's own path
        # rather than open_beneath(), which resolves and opens every component again: that made a
        # 5,000-file manifest seven times slower, and one is taken around every mutating command.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return file_sha256(fd).sha256
    except NotARegularFile:
        return None
    finally:
        os.close(fd)


def _entry(full: str, st: os.stat_result) -> dict[str, Any]:
    mode = st.st_mode
    if stat.S_ISREG(mode):
        kind = "file"
    elif stat.S_ISDIR(mode):
        kind = "dir"
    elif stat.S_ISLNK(mode):
        kind = "symlink"
    else:
        kind = "other"
    entry: dict[str, Any] = {"type": kind, "mode": stat.S_IMODE(mode)}
    if kind == "file":
        entry.update(size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=None)
    elif kind == "symlink":
        try:
            entry["target"] = os.readlink(full)
        except OSError:
            entry["target"] = None
    return entry


def workspace_manifest(workspace: Path | str, *, reuse: dict[str, Any] | None = None,
                       hash_max_bytes: int = HASH_MAX_BYTES) -> dict[str, Any]:
    """Describe every entry of the workspace: type, mode, size, mtime and sha256 of files.

    JSON-serialisable (the engine stores it on the step). ``reuse`` is an earlier manifest of the
    same workspace: a file whose size and mtime_ns are unchanged keeps its hash instead of being
    read again (git's stat cache), which keeps the after-command manifest cheap.
    Symlinks are recorded, never followed.
    """
    root = os.path.realpath(workspace)
    previous = (reuse or {}).get("entries", {})
    entries: dict[str, dict[str, Any]] = {}
    truncated = False
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            try:
                st = os.lstat(full)
            except OSError:
                continue  # vanished while walking
            entry = _entry(full, st)
            if entry["type"] == "file" and st.st_size <= hash_max_bytes:
                old = previous.get(rel)
                if (old and old.get("type") == "file" and old.get("sha256")
                        and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns):
                    entry["sha256"] = old["sha256"]
                else:
                    entry["sha256"] = _file_sha256(full)
            entries[rel] = entry
            if len(entries) >= MAX_ENTRIES:
                truncated = True
                break
        if truncated:
            break
    return {"version": MANIFEST_VERSION, "entries": entries, "truncated": truncated}


def _entry_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    if old.get("type") != new.get("type") or old.get("mode") != new.get("mode"):
        return True
    kind = new.get("type")
    if kind == "symlink":
        return bool(old.get("target") != new.get("target"))
    if kind == "file":
        if old.get("size") != new.get("size"):
            return True
        if old.get("sha256") and new.get("sha256"):
            return bool(old["sha256"] != new["sha256"])
        return bool(old.get("mtime_ns") != new.get("mtime_ns"))  # too large to hash
    return False  # a directory's mtime only reflects its children, which are compared themselves


def manifest_diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``{"created": [...], "modified": [...], "deleted": [...], "truncated": bool}``, paths sorted."""
    old_entries: dict[str, Any] = before.get("entries", {})
    new_entries: dict[str, Any] = after.get("entries", {})
    created = sorted(set(new_entries) - set(old_entries))
    deleted = sorted(set(old_entries) - set(new_entries))
    modified = sorted(path for path in set(old_entries) & set(new_entries)
                      if _entry_changed(old_entries[path], new_entries[path]))
    return {"created": created, "modified": modified, "deleted": deleted,
            "truncated": bool(before.get("truncated") or after.get("truncated"))}


def diff_is_empty(diff: dict[str, Any]) -> bool:
    return not (diff["created"] or diff["modified"] or diff["deleted"] or diff["truncated"])


def workspace_changed_since(workspace: Path | str, manifest: dict[str, Any]) -> bool:
    """Has anything in the workspace changed since ``manifest`` was taken?

    Conservative: an unknown manifest format or a truncated manifest counts as changed, because
    the caller uses "unchanged" as permission to run a mutating command again.
    """
    return workspace_changes_since(workspace, manifest) is not None


def workspace_changes_since(workspace: Path | str, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """What changed in the workspace since ``manifest`` (``manifest_diff``'s shape); None: nothing.
    An unknown manifest or a missing workspace is a change whose paths are unknown (empty lists,
    ``truncated`` true), as ``workspace_changed_since`` counts it."""
    if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION or not os.path.isdir(workspace):
        return {"created": [], "modified": [], "deleted": [], "truncated": True}
    diff = manifest_diff(manifest, workspace_manifest(workspace, reuse=None))
    return None if diff_is_empty(diff) else diff


def changes_text(diff: dict[str, Any], *, most: int = 10) -> str:
    """``modified count.txt; created out/a.txt, out/b.txt (and 3 more)``: for a reviewer."""
    parts = []
    for kind in ("modified", "created", "deleted"):
        paths = diff.get(kind) or []
        if paths:
            more = f" (and {len(paths) - most} more)" if len(paths) > most else ""
            parts.append(f"{kind} {', '.join(paths[:most])}{more}")
    if diff.get("truncated"):
        parts.append("more the manifest could not list")
    return "; ".join(parts) or "unknown paths"
