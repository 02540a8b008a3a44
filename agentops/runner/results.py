"""A job's result kept on the runner until the server acknowledges it: ``<key>.json`` (the result and
the files it published, by path, size and SHA-256) and ``<key>.files/`` (a copy of each file, taken
when the job ended: the workspace may change before the upload, or the runner restart).

The files go up in parts before the result (``Runner.deliver``): a result with its files inline
outgrew the server's request limit at ~740 KB and was retried for ever.
"""

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

# Answers that will not change however often the request is sent (401 stops the runner instead).
RETRYABLE_4XX = frozenset({408, 425, 429})


def refused_for_good(status: int) -> bool:
    return 400 <= status < 500 and status not in RETRYABLE_4XX


def _copy(workspace: Path, rel: str, to: Path) -> tuple[int, str] | None:
    """Copy a published file (opened beneath the workspace: no symlink leads out); (size, sha256),
    or None when it is not a regular file of the workspace any more."""
    from tools_app.sandbox import PathDenied, open_beneath, workspace_relpath

    try:
        fd = open_beneath(workspace, workspace_relpath(rel), os.O_RDONLY | os.O_NONBLOCK)
    except (PathDenied, OSError):
        return None
    digest, size = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            return None
        with to.open("wb") as copy:
            while chunk := source.read(1 << 20):
                digest.update(chunk)
                copy.write(chunk)
                size += len(chunk)
    return size, digest.hexdigest()


def result_keep(state: Path, job_id: str, workspace: Path, payload: dict[str, Any]) -> Path:
    """Keep the result of ``job_id`` and a copy of the files it published; returns the kept file."""
    key = job_id.replace(":", "_").replace("/", "_")
    folder = state / f"{key}.files"
    files = []
    for number, item in enumerate(payload.get("published_files") or []):
        folder.mkdir(exist_ok=True)
        rel = str(item.get("path", ""))
        copied = _copy(workspace, rel, folder / str(number))
        if copied is not None:
            files.append({"path": rel, "size": copied[0], "sha256": copied[1], "copy": str(number)})
    return result_replace(state / f"{key}.json", {"job_id": job_id, "result": payload, "files": files})


def result_replace(kept: Path, doc: dict[str, Any]) -> Path:
    """Write a kept result whole or not at all (a crash must not leave half a JSON document)."""
    partial = kept.with_suffix(".partial")
    partial.write_text(json.dumps(doc))
    os.replace(partial, kept)
    return kept


def result_forget(kept: Path) -> None:
    kept.unlink(missing_ok=True)
    shutil.rmtree(kept.with_suffix(".files"), ignore_errors=True)
