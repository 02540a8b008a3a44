"""The tool jobs this runner has started, kept in its work directory: a job served again (a man in
the middle re-sending a real signed job while it is still valid) must never run twice, across a
restart of the runner too.

One file per job under ``<workdir>/jobs-run/``, created exclusively and fsynced (the file and the
directory) before the job runs: a crash between the record and the run loses that run (the
server's recovery then asks the runner for the workspace manifest), never runs it twice. A record
is kept until an hour after its job expires; past its expiry the job's signature check refuses it.
"""

import hashlib
import json
import os
import time
from pathlib import Path

KEEP_AFTER_EXPIRY_SECONDS = 3600.0  # clock steps and a server's longer TTL stay covered


class JobJournal:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, job_id: str) -> Path:
        return self.root / hashlib.sha256(job_id.encode()).hexdigest()

    def record(self, job_id: str, expires_at: float) -> bool:
        """Record, durably, that ``job_id`` runs now. False when it was recorded before: it must
        not run again."""
        try:
            fd = os.open(self._path(job_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        try:
            os.write(fd, json.dumps({"job_id": job_id, "expires_at": expires_at}).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        directory = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(directory)  # the new name survives a power cut too
        finally:
            os.close(directory)
        return True

    def prune(self, now: float | None = None) -> None:
        """Forget the jobs expired for over ``KEEP_AFTER_EXPIRY_SECONDS``."""
        now = time.time() if now is None else now
        for path in self.root.iterdir():
            try:
                expires_at = float(json.loads(path.read_text())["expires_at"])
            except (OSError, ValueError, KeyError, TypeError):
                try:  # a record cut short by a crash: its age instead
                    expires_at = path.stat().st_mtime + 86400
                except OSError:
                    continue
            if expires_at + KEEP_AFTER_EXPIRY_SECONDS < now:
                path.unlink(missing_ok=True)
