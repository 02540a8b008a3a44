"""agentops and its peers on the same work, the same model and the same PostgreSQL, interleaved.

Usage: make bench-peers [PEERS_ARGS="--ns 50 200 400 --rounds 5 --systems agentops langgraph ..."]
       (runs ``bench/.venv-peers/bin/python bench/peers.py``; the venv comes from bench/peers-requirements.txt)
Env:   DATABASE_URL: the PostgreSQL database every system works in (default
       postgres://postgres@127.0.0.1:5432/bench_peers, created when missing). The peers drop and recreate
       their own tables there (checkpoint*, schema dbos, agent_sessions/agent_messages, peers_pg_*, peers_dj_*);
       agentops migrates its schema there and only adds rows. REDIS_URL: agentops's broker; unset, an
       embedded Redis is started for it (agentops.embedded_redis).

The work (bench/_peers_common.py): one turn of N model calls that each ask for one no-op tool call,
then a final answer; N = 50, 200, 400. The model is the project's scripted model server, one
process for all systems, zero latency, reached over HTTP by each system's own openai-SDK-based
client: agentops's real engine can only reach a model that way, so an in-process fake would
give the peers alone a cheaper model path.

Each system runs in a child process of its own (bench/_peer_*.py), set up once and warmed up
with one turn of N = 10; then, N by N, rounds: in every round every system runs one turn, the
systems' order rotating from round to round. SIGTERM stops the run and reports what is done.
Per turn: wall ms (in the child; agentops: session_start → Turn.finished_at), CPU of the
child's whole process tree (agentops: its worker, model gateway and Redis, not the driver polling
for the turn's end; the model server and PostgreSQL excluded for everyone), and, from the WAL
between two positions (bench/_peers_wal.py), the commits and WAL bytes of the transactions that
wrote to this database. The tables show the median over the rounds.
"""

import argparse
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

from _peers_wal import WalCounter, tree_cpu_seconds  # noqa: E402

DEFAULT_DSN = "postgres://postgres@127.0.0.1:5432/bench_peers"
WARMUP_N = 10
READY_TIMEOUT = 180.0
TURN_TIMEOUT = 1800.0  # the Agents SDK took over 7 min for one turn of N = 400 at load average 16


@dataclass
class System:
    key: str
    label: str
    script: str
    project_venv: bool  # the project's .venv (agentops, Django) or bench/.venv-peers
    args: tuple[str, ...] = ()
    about: str = ""
    versions: dict[str, str] = field(default_factory=dict)


SYSTEMS = [
    System("agentops", "agentops engine", "_peer_agentops.py", True, ("--system", "agentops")),
    System("psycopg", "floor: plain psycopg", "_peer_psycopg.py", False),
    System("django", "floor: Django ORM", "_peer_agentops.py", True, ("--system", "django")),
    System("langgraph", "LangGraph + PostgresSaver", "_peer_langgraph.py", False),
    System("dbos", "DBOS", "_peer_dbos.py", False),
    System("agents", "OpenAI Agents SDK + SQLAlchemySession", "_peer_agents.py", False),
]


class Child:
    """One system's process, spoken to through its stdin/stdout (bench/_peers_common.serve)."""

    def __init__(self, system: System, model_url: str, dsn: str, log_dir: Path) -> None:
        self.system = system
        python = str(ROOT / ".venv" / "bin" / "python") if system.project_venv else sys.executable
        command = [python, str(BENCH_DIR / system.script), "--model-url", model_url, "--dsn", dsn, *system.args]
        if system.key == "agentops":
            command = [python, "-m", "agentops.embedded_redis", "--", *command]
        self.log_path = log_dir / f"{system.key}.log"
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, bufsize=1, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def receive(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise SystemExit(f"{self.system.key}: no answer in {timeout:.0f} s; log: {self.log_path}") from None
        if line is None:
            raise SystemExit(f"{self.system.key} exited ({self.proc.wait()}):\n{self.tail()}")
        message: dict[str, Any] = json.loads(line)
        if "error" in message:
            raise SystemExit(f"{self.system.key} failed:\n{message['error']}\n{self.tail()}")
        return message

    def turn(self, n: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"n": n}) + "\n")
        self.proc.stdin.flush()
        return self.receive(TURN_TIMEOUT)

    def tail(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own process group, started above
            self.proc.wait(timeout=10)
        self.log.close()


def database(url: str) -> str:
    """DATABASE_URL as a postgresql:// DSN (SQLAlchemy-based peers refuse postgres://); create it when missing."""
    import psycopg

    parts = urlsplit(url)
    if not parts.scheme.startswith("postgres"):
        raise SystemExit(f"bench-peers needs PostgreSQL; DATABASE_URL is {url!r}")
    dsn = urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, ""))
    name = parts.path.lstrip("/")
    admin = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')
    return dsn


def start_model(log_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = (log_dir / "model.log").open("wb")
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), "-m", "scripted_model", "--port", str(port),
                             "--quiet"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/models", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the scripted model server did not start; see {log_dir / 'model.log'}") from None
            time.sleep(0.1)


def measure(child: Child, wal: WalCounter, n: int) -> dict[str, float]:
    cpu = tree_cpu_seconds(child.proc.pid)
    start = wal.position()
    result = child.turn(n)
    end = wal.position()
    cpu = tree_cpu_seconds(child.proc.pid) - cpu - result.get("exclude_cpu_ms", 0.0) / 1000
    written = wal.written(start, end)
    return {"ms": result["ms"] / n, "cpu": cpu * 1000 / n, "commits": written.commits / n,
            "wal": written.wal_bytes / n, "fpi": written.fpi_bytes / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ns", type=int, nargs="+", default=[200, 50, 400], help="run in this order")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", nargs="+", choices=[s.key for s in SYSTEMS], default=[s.key for s in SYSTEMS])
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the children and the model server too
    systems = [s for s in SYSTEMS if s.key in args.systems]
    dsn = database(os.environ.get("DATABASE_URL") or DEFAULT_DSN)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentops-bench-peers-{os.getpid()}"
    log_dir.mkdir()
    wal = WalCounter(dsn)
    model, model_url = start_model(log_dir)
    children: list[Child] = []
    samples: dict[tuple[str, int], list[dict[str, float]]] = {}
    idle: Any = None
    ok = False
    try:
        for system in systems:  # one at a time: start-up is not measured, and not crowded
            child = Child(system, model_url, dsn, log_dir)
            children.append(child)
            ready = child.receive(READY_TIMEOUT)
            system.about, system.versions = ready["about"], ready["versions"]
            child.turn(WARMUP_N)
        idle = _idle(wal)
        started = time.monotonic()
        for n in args.ns:  # N by N, so that a run stopped early (SIGTERM) still reports whole Ns
            for r in range(args.rounds):
                done = [measure(child, wal, n) for child in children[r % len(children):] + children[:r % len(children)]]
                for child, sample in zip(children[r % len(children):] + children[:r % len(children)], done,
                                         strict=True):
                    samples.setdefault((child.system.key, n), []).append(sample)
                print(f"  N={n} round {r + 1}/{args.rounds} done ({time.monotonic() - started:.0f} s)",
                      file=sys.stderr, flush=True)
        ok = True
    except SystemExit as stop:
        if stop.code != 143 or not samples:
            raise
        print("stopped (SIGTERM): the rounds done so far are reported", file=sys.stderr, flush=True)
        ok = True
    finally:
        for child in children:
            child.stop()
        model.terminate()
        model.wait(timeout=10)
        wal.close()
        if ok:
            for path in log_dir.iterdir():
                path.unlink()
            log_dir.rmdir()
        else:
            print(f"logs kept in {log_dir}", file=sys.stderr)
    from _peers_report import report

    report(systems=systems, samples=samples, ns=sorted({n for _, n in samples}), rounds=args.rounds, dsn=dsn,
           model_url=model_url, idle=idle)


def _idle(wal: WalCounter) -> Any:
    """What the database gets from all the set-up systems while none runs a turn (should be nothing)."""
    start = wal.position()
    time.sleep(2.0)
    return wal.written(start, wal.position())


if __name__ == "__main__":
    main()
