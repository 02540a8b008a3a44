"""The tables bench/peers.py prints: per N, each system's medians and agentops's ratio to it; then growth in N."""

import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
METRICS = ("ms", "cpu", "commits", "wal")


def report(*, systems: list[Any], samples: dict[tuple[str, int], list[dict[str, float]]], ns: list[int],
           rounds: int, dsn: str, model_url: str, idle: Any) -> None:
    import psycopg

    with psycopg.connect(dsn) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]  # type: ignore[index]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print("agentops and its peers: one turn of N model calls, each asking for one no-op tool call (issue 13)")
    print(f"  commit     {commit}, python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"  database   {dsn} (PostgreSQL {server}, synchronous_commit={sync}), the same one for every system")
    print(f"  model      scripted model server ({model_url}), one process, zero latency, over HTTP through each")
    print("             system's openai-SDK-based client (agentops's engine can only call a model over HTTP)")
    print(f"  method     N by N, up to {rounds} rounds, the systems' order rotating; in each round every system runs")
    print("             one turn; figures are medians over the rounds (min–max for ms/step)")
    print("             ms/step = turn wall time / N; CPU = the system's whole process tree / N (the model")
    print("             server, PostgreSQL and agentops's polling driver excluded); commits and WAL bytes =")
    print("             this database's transactions in the WAL between the turn's start and end")
    print("             (pg_walinspect), full-page images left out")
    print(f"  idle       while no turn ran (2 s, every system set up): {idle.commits} commits, "
          f"{idle.wal_bytes} WAL bytes")
    for system in systems:
        pins = ", ".join(f"{k} {v}" for k, v in system.versions.items())
        print(f"  {system.label}: {system.about} [{pins}]")
    for n in ns:
        _table(systems, samples, n)
    if len(ns) > 1:
        _growth(systems, samples, ns)
    sys.stdout.flush()


def _median(samples: list[dict[str, float]], metric: str) -> float:
    return statistics.median(s[metric] for s in samples)


def _table(systems: list[Any], samples: dict[tuple[str, int], list[dict[str, float]]], n: int) -> None:
    base = {m: _median(samples[("agentops", n)], m) for m in METRICS} if ("agentops", n) in samples else None
    print()
    print(f"N = {n} ({len(samples[(systems[0].key, n)])} rounds)")
    print(f"{'system':<38} {'ms/step':>8} {'min–max':>13} {'CPU ms':>7} {'commits':>8} {'WAL B':>8}"
          f" | {'agentops ÷ system:':<19}{'ms':>6} {'CPU':>6} {'commits':>8} {'WAL B':>6}")
    for system in systems:
        rows = samples[(system.key, n)]
        med = {m: _median(rows, m) for m in METRICS}
        lo, hi = min(r["ms"] for r in rows), max(r["ms"] for r in rows)
        line = (f"{system.label:<38} {med['ms']:8.2f} {f'{lo:.2f}–{hi:.2f}':>13} {med['cpu']:7.2f} "
                f"{med['commits']:8.2f} {med['wal']:8.0f} | ")
        if base is not None:
            line += " " * 19 + " ".join(f"{_ratio(base[m], med[m]):>{w}}" for m, w in zip(METRICS, (6, 6, 8, 6),
                                                                                          strict=True))
        print(line)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "—"


def _growth(systems: list[Any], samples: dict[tuple[str, int], list[dict[str, float]]], ns: list[int]) -> None:
    lo, hi = min(ns), max(ns)
    print()
    print(f"growth with N (medians; growth = N={hi} ÷ N={lo}; flat = 1.00×)")
    head = " ".join(f"{f'N={n}':>8}" for n in ns)
    print(f"{'system':<38} {'ms/step at':>10} {head} {'growth':>7} | {'WAL B/step growth':>17} "
          f"{'commits/step growth':>19}")
    for system in systems:
        cells = " ".join(f"{_median(samples[(system.key, n)], 'ms'):8.2f}" for n in ns)
        grow = {m: _ratio(_median(samples[(system.key, hi)], m), _median(samples[(system.key, lo)], m))
                for m in ("ms", "wal", "commits")}
        print(f"{system.label:<38} {'':>10} {cells} {grow['ms']:>7} | {grow['wal']:>17} {grow['commits']:>19}")
