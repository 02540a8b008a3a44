"""Workspace file tools. They run on the host (as the worker's user), so every path goes through
workspace_relpath() and open_beneath(): a symlink an agent planted must not lead outside."""

import difflib
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from tools_app.sandbox import (
    NotARegularFile,
    PathDenied,
    open_beneath,
    resolve_in_workspace,
    sandbox_ids,
    workspace_file_sha256,
    workspace_relpath,
)

from .registry import ToolContext, ToolError, ToolResult, cap_text

OUTPUTS_DIR = "outputs"
READ_DEFAULT_BYTES = 64 * 1024
READ_MAX_BYTES = 1024 * 1024
WRITE_MAX_CHARS = 2 * 1024 * 1024
DIFF_MAX_BYTES = 1024 * 1024  # previous contents larger than this are not diffed line by line
PUBLISH_MAX_BYTES = 512 * 1024 * 1024
PATH_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 4096}


def _read_regular(workspace: Path, rel: str, limit: int) -> tuple[bytes, int]:
    """Read up to ``limit`` bytes of a regular file; return (data, full size)."""
    # O_NONBLOCK: opening a FIFO the agent created must not block the worker.
    fd = open_beneath(workspace, rel, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ToolError("invalid_arguments", f"{rel!r} is not a regular file")
        chunks, remaining = [], limit
        while remaining > 0 and (chunk := os.read(fd, min(remaining, 1024 * 1024))):
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks), st.st_size
    finally:
        os.close(fd)


def published_file(workspace: Path, rel: str) -> dict[str, Any]:
    try:
        size, sha256 = workspace_file_sha256(workspace, rel)
    except NotARegularFile:
        raise ToolError("invalid_arguments", f"{rel!r} is not a regular file") from None
    if size > PUBLISH_MAX_BYTES:
        raise ToolError("limit_exceeded", f"{rel!r} is {size} bytes; the artifact limit is {PUBLISH_MAX_BYTES}")
    return {"path": rel, "size": size, "sha256": sha256}


def published_from_changes(workspace: Path, changed: list[str]) -> list[dict[str, Any]]:
    """Files under outputs/ that a tool created or modified: they are published as artifacts."""
    files = []
    for rel in sorted(changed):
        if not rel.startswith(OUTPUTS_DIR + "/"):
            continue
        try:
            files.append(published_file(workspace, rel))
        except (OSError, ToolError, PathDenied):
            continue  # a directory, a symlink out, or gone again: nothing to publish
    return files


# --- list_files -------------------------------------------------------------------------------------

LIST_FILES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {**PATH_SCHEMA, "default": ".", "description": "Directory relative to /workspace."},
        "recursive": {"type": "boolean", "default": False},
        "max_entries": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
    },
    "additionalProperties": False,
}


def _describe(name: str, st: os.stat_result, link_target: str | None) -> tuple[str, dict[str, Any]]:
    if stat.S_ISDIR(st.st_mode):
        return f"{name}/", {"path": name, "type": "dir"}
    if stat.S_ISLNK(st.st_mode):
        return f"{name} -> {link_target}", {"path": name, "type": "symlink", "target": link_target}
    if stat.S_ISREG(st.st_mode):
        return f"{name}  ({st.st_size} bytes)", {"path": name, "type": "file", "size": st.st_size}
    return f"{name}  (special)", {"path": name, "type": "other"}


def list_files(ctx: ToolContext) -> ToolResult:
    rel = workspace_relpath(ctx.arguments.get("path", "."))
    limit = int(ctx.arguments.get("max_entries", 1000))
    fd = open_beneath(ctx.workspace, rel, os.O_RDONLY | os.O_DIRECTORY)
    lines: list[str] = []
    entries: list[dict[str, Any]] = []
    truncated = False
    try:
        walker = (os.fwalk(".", dir_fd=fd, follow_symlinks=False) if ctx.arguments.get("recursive")
                  else iter([(".", [], sorted(os.listdir(fd)), fd)]))
        for dirpath, dirnames, filenames, dirfd in walker:
            dirnames.sort()
            for name in sorted(set(dirnames) | set(filenames)):
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                target = os.readlink(name, dir_fd=dirfd) if stat.S_ISLNK(st.st_mode) else None
                shown = os.path.normpath(os.path.join(dirpath, name))
                line, entry = _describe(shown, st, target)
                lines.append(line)
                entries.append(entry)
                if len(entries) >= limit:
                    truncated = True
                    break
            if truncated:
                break
    finally:
        os.close(fd)
    if truncated:
        lines.append(f"[listing stopped at {limit} entries]")
    output = "\n".join(lines) if lines else "(empty directory)"
    return ToolResult(status="completed", output=output, data={"entries": entries, "truncated": truncated})


# --- read_file --------------------------------------------------------------------------------------

READ_FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": PATH_SCHEMA,
        "max_bytes": {"type": "integer", "minimum": 1, "maximum": READ_MAX_BYTES, "default": READ_DEFAULT_BYTES},
    },
    "required": ["path"],
    "additionalProperties": False,
}


def read_file(ctx: ToolContext) -> ToolResult:
    rel = workspace_relpath(ctx.arguments["path"])
    limit = int(ctx.arguments.get("max_bytes", READ_DEFAULT_BYTES))
    data, size = _read_regular(ctx.workspace, rel, limit)
    truncated = size > len(data)
    if b"\x00" in data[:8192]:
        text = f"(binary file, {size} bytes)"
    else:
        text = data.decode("utf-8", "replace")
        if truncated:
            text += f"\n[... file is {size} bytes; only the first {len(data)} were read ...]"
    return ToolResult(status="completed", output=text, data={"path": rel, "size": size, "truncated": truncated})


# --- write_file -------------------------------------------------------------------------------------

WRITE_FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": PATH_SCHEMA, "content": {"type": "string", "maxLength": WRITE_MAX_CHARS}},
    "required": ["path", "content"],
    "additionalProperties": False,
}


def _previous_content(workspace: Path, rel: str) -> bytes | None:
    try:
        data, size = _read_regular(workspace, rel, DIFF_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    return data if size <= DIFF_MAX_BYTES else b"\x00(too large to diff)"


def _unified_diff(rel: str, old: bytes | None, new: str) -> str:
    if old is not None and b"\x00" in old:
        return f"--- a/{rel}\n+++ b/{rel}\n(previous content is binary or too large to diff; replaced)\n"
    old_lines = old.decode("utf-8", "replace").splitlines(keepends=True) if old is not None else []
    new_lines = new.splitlines(keepends=True)
    lines = []
    for line in difflib.unified_diff(old_lines, new_lines, fromfile="/dev/null" if old is None else f"a/{rel}",
                                     tofile=f"b/{rel}"):
        lines.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(lines) or f"(no changes to {rel})\n"


def _write_target(arguments: Any) -> tuple[str, str]:
    if not isinstance(arguments, dict) or not isinstance(arguments.get("path"), str) \
            or not isinstance(arguments.get("content"), str):
        raise ToolError("invalid_arguments", "write_file needs a string 'path' and a string 'content'")
    rel = workspace_relpath(arguments["path"])
    if not rel:
        raise ToolError("invalid_arguments", "write_file needs a file path, not the workspace itself")
    return rel, arguments["content"]


def _no_links(workspace: Path, rel: str) -> None:
    """write_file writes where its path says or not at all: through a symlink in the workspace
    (``notes.txt`` -> ``.local/…/usercustomize.py``) the reviewer's diff and the result named the
    link while the content went to its target (an audit planted code that way)."""
    target = resolve_in_workspace(workspace, rel)
    if target != rel:
        raise ToolError("denied", f"{rel!r} goes through a symlink to {target!r}; write_file does not follow "
                                  f"symlinks: give the path {target!r} itself")


def write_file_preview(workspace: Path, arguments: dict[str, Any]) -> str:
    """The unified diff write_file would apply, without writing. Never raises for bad input."""
    try:
        rel, content = _write_target(arguments)
        _no_links(workspace, rel)
        return _unified_diff(rel, _previous_content(workspace, rel), content)
    except ToolError as exc:
        return f"(cannot preview: {exc.message})"
    except PathDenied as exc:
        return f"(cannot preview: denied: {exc})"
    except OSError as exc:
        return f"(cannot preview: {exc.strerror or exc})"


def write_file(ctx: ToolContext) -> ToolResult:
    rel, content = _write_target(ctx.arguments)
    _no_links(ctx.workspace, rel)
    previous = _previous_content(ctx.workspace, rel)
    diff = _unified_diff(rel, previous, content)
    encoded = content.encode("utf-8")
    fd = open_beneath(ctx.workspace, rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o644,
                      create_parents=True)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ToolError("invalid_arguments", f"{rel!r} is not a regular file")
        # The sandboxed commands run as the sandbox uid and must be able to edit what we write.
        uid, gid = sandbox_ids()
        os.fchown(fd, uid, gid)
        view = memoryview(encoded)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    unchanged = previous == encoded
    changes: dict[str, list[str]] = {"created": [] if previous is not None else [rel],
                                     "modified": [rel] if previous is not None and not unchanged else [],
                                     "deleted": []}
    published = published_from_changes(ctx.workspace, changes["created"] + changes["modified"])
    return ToolResult(status="completed", output=cap_text(diff), files_changed=changes, published_files=published,
                      data={"path": rel, "bytes_written": len(encoded),
                            "sha256": hashlib.sha256(encoded).hexdigest()})


# --- publish_artifact -------------------------------------------------------------------------------

PUBLISH_ARTIFACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": PATH_SCHEMA},
    "required": ["path"],
    "additionalProperties": False,
}


def publish_artifact(ctx: ToolContext) -> ToolResult:
    rel = workspace_relpath(ctx.arguments["path"])
    if not rel:
        raise ToolError("invalid_arguments", "publish_artifact needs a file path")
    info = published_file(ctx.workspace, rel)
    return ToolResult(status="completed", output=f"published {rel} ({info['size']} bytes, sha256 {info['sha256']})",
                      published_files=[info], data=info)
