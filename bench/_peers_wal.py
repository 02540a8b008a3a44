"""What one turn wrote and burnt, measured from outside the system under test (bench/peers.py).

- ``WalCounter``: between two WAL positions, the transactions that wrote to *this* database (their
  records name a relation ``<tablespace>/<this database's oid>/…``; subtransactions are matched
  through the COMMIT record's subxact list) and, of those, the COMMIT records (transactions that
  waited for a WAL flush) and the WAL bytes of their records, without full-page images (those
  depend on when the last checkpoint was, not on the work). Read with ``pg_walinspect``
  (PostgreSQL 15+, ``CREATE EXTENSION`` needs a superuser). Other databases on the server (other
  users' work) and records without a transaction (vacuum, pruning) are not counted.
- ``tree_cpu_seconds``: user + system CPU of a process and all its descendants (Linux /proc).
"""

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SUBXACTS = re.compile(r"subxacts:((?: \d+)+)")
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Written:
    commits: int
    wal_bytes: int  # records of this database's transactions, full-page images left out
    fpi_bytes: int
    records: int


class WalCounter:
    def __init__(self, dsn: str) -> None:
        import psycopg

        self.conn: Any = psycopg.connect(dsn, autocommit=True)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        self.database_oid = int(self._one("SELECT oid FROM pg_database WHERE datname = current_database()"))
        # Other work on the server may write enough WAL for a checkpoint to recycle a window's
        # segments before they are read: a temporary physical slot (gone with this connection)
        # holds them; ``written`` moves it on past each window it has read.
        self.slot = f"bench_peers_{os.getpid()}"
        self.conn.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", [self.slot])

    def position(self) -> str:
        return str(self._one("SELECT pg_current_wal_flush_lsn()"))

    def _one(self, sql: str) -> Any:
        row = self.conn.execute(sql).fetchone()
        assert row is not None
        return row[0]

    def written(self, start: str, end: str) -> Written:
        if start == end:
            return Written(0, 0, 0, 0)
        # Only this database's transactions (and COMMIT records that list subtransactions) leave
        # the server: the window may hold a lot of other databases' WAL.
        rows = self.conn.execute(
            "WITH r AS (SELECT xid::text::bigint AS xid, resource_manager, record_type, record_length, fpi_length,"
            "                  description, coalesce(block_ref ~ %s, false) AS touches"
            "           FROM pg_get_wal_records_info(%s, %s)),"
            "     ours AS (SELECT DISTINCT xid FROM r WHERE touches AND xid <> 0)"
            " SELECT * FROM r WHERE xid IN (SELECT xid FROM ours)"
            "    OR (resource_manager = 'Transaction' AND description LIKE '%%subxacts:%%')",
            [rf"rel \d+/{self.database_oid}/", start, end]).fetchall()
        self.conn.execute("SELECT pg_replication_slot_advance(%s, %s)", [self.slot, end])
        return count(rows)

    def close(self) -> None:
        self.conn.close()


def count(rows: Iterable[tuple[int, str, str, int, int, str, bool]]) -> Written:
    """Rows: (xid, resource manager, record type, length, FPI length, description, touches this database)."""
    rows = list(rows)
    ours = {xid for xid, *_, touches in rows if touches and xid}
    commits = set()
    for xid, manager, kind, *_, description, _touches in rows:
        if manager == "Transaction" and kind.startswith("COMMIT") and xid:
            match = _SUBXACTS.search(description or "")
            subxacts = {int(x) for x in match.group(1).split()} if match else set()
            if xid in ours or subxacts & ours:
                commits.add(xid)
    counted = [row for row in rows if row[0] and (row[0] in ours or row[0] in commits)]
    return Written(commits=len(commits), wal_bytes=sum(r[3] - r[4] for r in counted),
                   fpi_bytes=sum(r[4] for r in counted), records=len(counted))


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and every live descendant (children that exited and
    were waited for are in their parent's cutime/cstime, added too)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        cpu[pid] = sum(int(f) for f in fields[11:15]) / _TICKS  # utime stime cutime cstime
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += cpu.get(pid, 0.0)
        stack.extend(child for child, parent in parents.items() if parent == pid)
    return total
