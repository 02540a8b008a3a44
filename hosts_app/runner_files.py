"""The files a runner's job published (``outputs/…``), uploaded in parts before its result.

A runner used to send them base64-encoded inside the result: past ~740 KB the body went over
``AGENTOPS_MAX_REQUEST_BYTES``, the server answered 413 and the runner retried forever, polling no
more. Now each file goes up in raw parts of at most ``upload_chunk_bytes()`` (what a request may
carry), each part stored in artifact storage under the job (``<session>/parts/<job>/<sha256>/<offset>``;
any storage backend, any web process), and the result names the files by size and SHA-256: they
are put together, checked and stored content-addressed as the local sandbox stores them, up to the
same limit (``PUBLISH_MAX_BYTES``). A file that did not arrive whole is recorded as not uploaded,
in the step's result and its output, where the reviewer sees it.
"""

import hashlib
import logging
import mimetypes
import re
import tempfile
from typing import Any

from django.conf import settings
from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import storages

from agentops.domain import InvalidArguments
from sessions_app.models import Step
from tools_app.builtin.files import PUBLISH_MAX_BYTES

log = logging.getLogger(__name__)

SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_CHUNK_BYTES = 8 * 1024 * 1024


def upload_chunk_bytes() -> int:
    """The most a runner puts in one part: a request's limit, less room for the rest of it."""
    return max(4096, min(settings.AGENTOPS_MAX_REQUEST_BYTES, MAX_CHUNK_BYTES) - 1024)


def _parts_dir(step: Step, job_id: str, sha256: str) -> str:
    return f"{step.session_id}/parts/{job_id.replace(':', '_')}/{sha256}"


def file_part_store(*, step: Step, job_id: str, sha256: str, offset: int, size: int, data: bytes) -> int:
    """Keep one part of a published file (idempotent: a part sent again is kept once). Returns the
    bytes received so far up to this part. InvalidArguments (422, for good) for a file over the
    artifact limit or a part that does not fit it."""
    if not SHA256.match(sha256):
        raise InvalidArguments("a file is named by the SHA-256 of its content (64 hex digits)")
    if size > PUBLISH_MAX_BYTES:
        raise InvalidArguments(f"the file is {size} bytes; the artifact limit is {PUBLISH_MAX_BYTES}",
                               code="limit_exceeded")
    if offset < 0 or offset + len(data) > size or (not data and size):
        raise InvalidArguments(f"a part of {len(data)} bytes at {offset} does not fit a file of {size} bytes")
    storage = storages["artifacts"]
    name = f"{_parts_dir(step, job_id, sha256)}/{offset:012d}"
    if not storage.exists(name):
        storage.save(name, ContentFile(data))
    return offset + len(data)


def _assemble(step: Step, job_id: str, item: dict[str, Any]) -> dict[str, Any] | str:
    """The stored artifact's fields, or why the file is not there (missing or damaged parts)."""
    storage = storages["artifacts"]
    sha256, size = str(item.get("sha256", "")), int(item.get("size") or 0)
    if not SHA256.match(sha256):
        return "not named by its SHA-256"
    folder = _parts_dir(step, job_id, sha256)
    try:
        parts = sorted(storage.listdir(folder)[1])
    except FileNotFoundError:
        parts = []
    digest, received = hashlib.sha256(), 0
    with tempfile.TemporaryFile() as spool:
        for part in parts:
            if not part.isdigit() or int(part) != received:
                break
            with storage.open(f"{folder}/{part}") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
                    spool.write(chunk)
                    received += len(chunk)
        for part in parts:
            storage.delete(f"{folder}/{part}")
        if received != size or digest.hexdigest() != sha256:
            return f"{received} of its {size} bytes arrived" if received != size else "its content did not match"
        spool.seek(0)
        name = f"{step.session_id}/{sha256}"
        if not storage.exists(name):  # content-addressed, as the local sandbox stores artifacts
            name = storage.save(name, File(spool))
    path = str(item.get("path", ""))[:500]
    return {"path": path, "size": size, "sha256": sha256, "storage_path": name,
            "content_type": mimetypes.guess_type(path)[0] or "application/octet-stream"}


def published_files_store(*, step: Step, job_id: str, files: list[dict[str, Any]]
                          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the files stored as artifacts, the files not uploaded with why): the runner's own verdict
    (``not_uploaded``: the server refused a part for good) or a file that did not arrive whole."""
    stored, missing = [], []
    for item in files:
        path = str(item.get("path", ""))[:500]
        reason = item.get("not_uploaded") or None
        outcome = _assemble(step, job_id, item) if reason is None else str(reason)[:300]
        if isinstance(outcome, dict):
            stored.append(outcome)
        else:
            log.warning("job %s: %s not uploaded: %s", job_id, path, outcome)
            missing.append({"path": path, "size": item.get("size"), "reason": outcome})
    return stored, missing


def published_files_forget(*, step: Step, job_id: str, files: list[dict[str, Any]]) -> None:
    """Drop the parts of a result sent again (already recorded): nothing will assemble them."""
    storage = storages["artifacts"]
    for item in files:
        sha256 = str(item.get("sha256", ""))
        if SHA256.match(sha256):
            folder = _parts_dir(step, job_id, sha256)
            try:
                for part in storage.listdir(folder)[1]:
                    storage.delete(f"{folder}/{part}")
            except FileNotFoundError:
                continue


def not_uploaded_note(missing: list[dict[str, Any]]) -> str:
    """What the step's output says of the files that are not artifacts."""
    return "".join(f"\n[runner] {m['path']} ({m['size']} bytes) was not uploaded: {m['reason']}." for m in missing)
