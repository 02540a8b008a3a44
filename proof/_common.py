"""Set-up shared by the proofs: a database of the proof's own, timing, the table and verdicts."""

import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/postgres"


def database_url(name: str) -> str:
    """``DATABASE_URL``'s server with database ``name`` (the proofs never write to DATABASE_URL's own)."""
    parts = urlsplit(os.environ.get("DATABASE_URL", DEFAULT_SERVER))
    if not parts.scheme.startswith("postgres"):
        raise SystemExit(f"the proofs need PostgreSQL; DATABASE_URL is {parts.scheme}://…")
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def recreate_database(url: str) -> None:
    """Drop (if present) and create the database of ``url``."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    admin = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parts.path.lstrip("/")}" WITH (FORCE)')


def django_setup(url: str) -> None:
    """Point Django at ``url`` and set it up (call once, before importing models)."""
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "agentops.settings"
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    # A local proof on throwaway databases: the development secret key is fine (and the stack's
    # processes inherit this environment).
    os.environ.setdefault("AGENTOPS_DEMO", "1")
    import django

    django.setup()


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0–100), nearest-rank on the sorted values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Verdict:
    target: str
    measured: str
    ok: bool
    asserted: bool = True


def timing_asserted(full: bool) -> bool:
    """Whether absolute timing targets (latency, throughput) decide the verdict: in full size, or
    with PROOF_STRICT=1. The short form runs in CI on shared machines, where other jobs' load sets
    the tail (measured: push p99 ×5 with the load average at 10); there it asserts correctness
    (errors, losses, duplicates, gaps) and prints the timing verdicts with their ratio to the target."""
    return full or os.environ.get("PROOF_STRICT", "") not in ("", "0")


@dataclass
class Result:
    """What a proof found: its verdicts (each target met or not) and anything worth reporting."""

    name: str
    verdicts: list[Verdict] = field(default_factory=list)
    strict_timing: bool = True

    def check(self, target: str, measured: str, ok: bool, *, timing: bool = False) -> None:
        """A verdict; ``timing``: an absolute latency or throughput target (see ``timing_asserted``)."""
        self.verdicts.append(Verdict(target, measured, ok, asserted=self.strict_timing or not timing))

    @property
    def ok(self) -> bool:
        return bool(self.verdicts) and all(v.ok for v in self.verdicts if v.asserted)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                                     strict=True))))
        if n == 0:
            print("  " + "-+-".join("-" * w for w in widths))
    sys.stdout.flush()


def print_verdicts(result: Result) -> None:
    print(f"verdicts ({result.name}):")
    for v in result.verdicts:
        mark = "PASS" if v.ok else "FAIL" if v.asserted else "MISS, not asserted in the short form"
        print(f"  [{mark}] {v.target}: {v.measured}")
    sys.stdout.flush()


def machine() -> str:
    """CPUs and load: the proofs run on shared machines, and a busy one shows in every tail."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs, load average {load} (1/5/15 min) at the start"
