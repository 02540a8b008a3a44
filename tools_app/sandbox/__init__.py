"""The sandbox: per-session workspaces, bubblewrap-isolated commands, and effect evidence."""

from .backend import sandbox_status
from .bubblewrap import run_sandboxed
from .manifest import changes_text, manifest_diff, workspace_changed_since, workspace_changes_since, workspace_manifest
from .policy import CommandResult, SandboxPolicy, SandboxUnavailable
from .progress import OutputBatcher, parse_progress
from .workspace import (
    FileDigest,
    NotARegularFile,
    PathDenied,
    file_sha256,
    open_beneath,
    resolve_in_workspace,
    sandbox_ids,
    workspace_file_sha256,
    workspace_for,
    workspace_purge,
    workspace_relpath,
    workspace_retire,
)

__all__ = [
    "CommandResult",
    "FileDigest",
    "NotARegularFile",
    "OutputBatcher",
    "PathDenied",
    "SandboxPolicy",
    "SandboxUnavailable",
    "file_sha256",
    "manifest_diff",
    "open_beneath",
    "parse_progress",
    "resolve_in_workspace",
    "run_sandboxed",
    "sandbox_ids",
    "sandbox_status",
    "workspace_changed_since",
    "workspace_changes_since",
    "changes_text",
    "workspace_file_sha256",
    "workspace_for",
    "workspace_manifest",
    "workspace_purge",
    "workspace_relpath",
    "workspace_retire",
]
