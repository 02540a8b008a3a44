"""agentops.sqlite_backend: a transaction holds the writers' lock file from its BEGIN to its commit
or rollback, and a second writer waits on that lock (not in SQLite's busy handler) until then.
Run on a SQLite file of the test's own, whatever database the suite uses."""

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db.utils import ConnectionHandler


@pytest.fixture(autouse=True)
def _own_database(django_db_blocker: Any) -> Iterator[None]:
    with django_db_blocker.unblock():  # the test's own file, not the suite's database
        yield


def _connection(path: Path) -> Any:
    handler = ConnectionHandler({"default": {"ENGINE": "agentops.sqlite_backend", "NAME": str(path),
                                             "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20}}})
    return handler["default"]


def _begin(connection: Any) -> None:
    """What transaction.atomic() does first on SQLite (BEGIN IMMEDIATE, in autocommit mode)."""
    connection.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)


def _lock_free(path: Path) -> bool:
    fd = os.open(f"{path}.writers", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _flock_waiters(inode: int) -> int:
    """Blocked flock requests on the file with this inode (Linux's /proc/locks: "N: -> FLOCK ...")."""
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for line in lines if "-> FLOCK" in line and line.split()[-3].endswith(f":{inode}"))


def test_a_transaction_holds_the_writers_lock_until_commit_rollback_or_close(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    connection = _connection(path)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE t (x integer)")  # autocommit: no lock taken
    assert _lock_free(path)
    for end in ("commit", "rollback", "close"):
        _begin(connection)
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)")
        assert not _lock_free(path), end
        getattr(connection, end)()
        assert _lock_free(path), end
        if end != "close":
            connection.set_autocommit(True)
    connection.close()


def test_a_second_writer_begins_once_the_first_commits(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    first = _connection(path)
    with first.cursor() as cursor:
        cursor.execute("CREATE TABLE t (x integer)")
    order: list[str] = []
    waiting = threading.Event()

    def second_writer() -> None:
        second = _connection(path)
        waiting.set()
        _begin(second)
        order.append("second began")
        with second.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM t")
            order.append(f"second saw {cursor.fetchone()[0]}")
        second.commit()
        second.close()

    _begin(first)
    with first.cursor() as cursor:
        cursor.execute("INSERT INTO t VALUES (1)")
    thread = threading.Thread(target=second_writer)
    thread.start()
    waiting.wait(5)
    # It waits in the lock file's queue (a blocked flock in /proc/locks), not in SQLite's busy handler.
    inode = os.stat(f"{path}.writers").st_ino
    deadline = time.monotonic() + 10
    while not _flock_waiters(inode) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _flock_waiters(inode) == 1 and thread.is_alive() and order == []
    order.append("first committed")
    first.commit()
    thread.join(10)
    assert order == ["first committed", "second began", "second saw 1"]
    first.close()
