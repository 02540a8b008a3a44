"""SQLite with its writers queued by the kernel (the default database: ``make run``, ``make test``).

Every transaction here is ``BEGIN IMMEDIATE``: it takes SQLite's one write lock at its start. A
writer that finds the lock taken does not wait for it: SQLite's busy handler sleeps and tries
again, 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50 then 100 ms at a time. With the web, the gateway
and the worker writing at once, a lock freed 1 ms after a waiter fell asleep stays unused for the
rest of its sleep, and the sleeps grow the longer it waited: ``make run`` took 200 new sessions in
6.2-7.0 s, its daphne threads waiting in ``BEGIN IMMEDIATE`` a third of the time (py-spy).

So a transaction first takes an exclusive ``flock`` on a file beside the database (its own open
file, so threads of one process exclude each other too), and keeps it until its commit or
rollback: writers wait in the kernel's queue and the next one is woken the moment the lock is
freed. Only the span SQLite would lock anyway is covered, so no new wait arises; a statement
outside a transaction (autocommit) still meets SQLite's busy handler. An in-memory database has
no file to lock and is left as it is.
"""

import fcntl
import os
from typing import Any

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    _writer_lock: int | None = None

    def _lock_path(self) -> str | None:
        return None if self.is_in_memory_db() else f"{self.settings_dict['NAME']}.writers"

    def _start_transaction_under_autocommit(self) -> None:
        path = self._lock_path()
        if path is not None and self._writer_lock is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            self._writer_lock = fd
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # not in django-stubs
        except BaseException:
            self._writer_lock_release()
            raise

    def _writer_lock_release(self) -> None:
        fd, self._writer_lock = self._writer_lock, None
        if fd is not None:
            os.close(fd)  # closing the file frees its flock

    def _commit(self) -> Any:
        try:
            return super()._commit()  # type: ignore[misc]
        finally:
            self._writer_lock_release()

    def _rollback(self) -> Any:
        try:
            return super()._rollback()  # type: ignore[misc]
        finally:
            self._writer_lock_release()

    def _close(self) -> Any:
        try:
            return super()._close()  # type: ignore[misc]
        finally:
            self._writer_lock_release()
