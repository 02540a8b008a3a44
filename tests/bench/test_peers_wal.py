"""bench/peers.py's meters, which need no peer virtualenv: the WAL counter and the process-tree CPU."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _peers_wal import WalCounter, count, tree_cpu_seconds  # noqa: E402


def _dsn() -> str:
    s = connection.settings_dict
    return f"postgresql://{s['USER']}:{s['PASSWORD'] or ''}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_wal_counter_counts_this_databases_write_transactions() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("pg_walinspect needs PostgreSQL")
    dsn = _dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS peers_wal_probe")
        conn.execute("CREATE TABLE peers_wal_probe (id serial PRIMARY KEY, body text)")
    counter = WalCounter(dsn)
    try:
        with psycopg.connect(dsn) as conn:
            start = counter.position()
            for _ in range(3):  # three write transactions
                with conn.transaction():
                    conn.execute("INSERT INTO peers_wal_probe (body) VALUES (repeat('x', 500))")
            with conn.transaction():  # read only: no COMMIT record
                conn.execute("SELECT count(*) FROM peers_wal_probe")
            with conn.transaction(), conn.transaction():  # the only write is in a subtransaction
                conn.execute("INSERT INTO peers_wal_probe (body) VALUES ('sub')")
            conn.commit()
            written = counter.written(start, counter.position())
    finally:
        counter.close()

    assert written.commits == 4
    assert written.wal_bytes > 3 * 500  # the three rows' bodies at least


def test_wal_count_leaves_out_other_databases_and_records_without_a_transaction() -> None:
    rows = [  # (xid, manager, type, length, fpi length, description, touches this database)
        (10, "Heap", "INSERT", 100, 0, "", True),
        (10, "Transaction", "COMMIT", 40, 0, "2026-12-01", False),
        (11, "Heap", "INSERT", 100, 8000, "", False),  # another database
        (11, "Transaction", "COMMIT", 40, 0, "2026-12-01", False),
        (0, "Heap2", "PRUNE", 60, 0, "", True),  # pruning: no transaction
        (13, "Heap", "INSERT", 270, 200, "", True),  # a subtransaction of 12; 200 of its bytes a full-page image
        (12, "Transaction", "COMMIT", 50, 0, "2026-12-01; subxacts: 13", False),
    ]
    written = count(rows)
    assert (written.commits, written.wal_bytes, written.fpi_bytes, written.records) == (2, 260, 200, 4)


def test_tree_cpu_counts_the_cpu_of_descendants() -> None:
    burn = ("import time\nstart = time.process_time()\nwhile time.process_time() - start < 0.3: pass\n"
            "print(1, flush=True)\ntime.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "1"  # the grandchild burnt 0.3 s
        cpu = tree_cpu_seconds(parent.pid)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the group this test started: parent and grandchild
        parent.wait()
    assert cpu >= 0.25
