"""Chaos (issue 13, point 2): the real stack keeps every promise while its processes are killed.

The stack (``stack.py``: daphne, the engine and sandbox Celery workers, the model gateway, beat,
the scripted model, a private Redis, a PostgreSQL database of the proof's own) runs turns that mix
``send_email``, ``write_file``, ``run_command``, ``http_request`` (to a local server here that
counts requests by token and by ``Idempotency-Key``) and a client tool. Everything is driven
through the public API as an integration would: an operator starts sessions and turns (with
``Idempotency-Key``), a reviewer bot decides every approval (approve, approve with edited
arguments, reject; recovery requests: ``mark_done`` for a command, ``retry`` for an HTTP request),
a client bot submits the client tool's output. WebSocket and SSE clients stay subscribed to every
session. Meanwhile a chaos loop SIGKILLs a random process (a worker, the gateway, beat or daphne)
and restarts it, restarts Redis (twice in full size: everything in it is lost) and ends every
PostgreSQL connection of the proof's database once (``pg_terminate_backend``: the machine's
server is shared, so it is not restarted).

Afterwards it checks, from the database, the counting server, the workspaces and the clients:
every turn ended; no email sent twice; no external request applied twice; no command ran twice
(each writes a line with its own token to an append-only file); every session's events gap-free;
every client ended with every event (each seq counted once after replay); and it counts each
recovery path taken.

One script (~550 lines) on purpose: the bots, the chaos loop and the checks share the run's state
(tokens, counters, clients) and read top to bottom as the proof's protocol; the stack, the world
and the watchers it reuses are their own modules.

    python -m proof.chaos [--full]
"""

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from proof._common import (
    Result,
    database_url,
    django_setup,
    drop_database,
    machine,
    percentile,
    print_table,
    print_verdicts,
    recreate_database,
)
from proof.stack import Stack, start_watchers
from proof.world import CLIENT_TOOL, world_setup

KILLABLE = ["worker-engine", "worker-sandbox", "gateway", "beat", "web", "announcer"]


class Counting:
    """The external service http_request calls: counts requests by URL token and by Idempotency-Key;
    applies each key once (as a payment API would)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_token: Counter[str] = Counter()
        self.by_key: Counter[str] = Counter()
        self.keys_of_token: dict[str, set[str]] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                token = self.path.rsplit("/", 1)[-1]
                key = self.headers.get("Idempotency-Key", "")
                with outer.lock:
                    outer.by_token[token] += 1
                    outer.by_key[key] += 1
                    outer.keys_of_token.setdefault(token, set()).add(key)
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _pick(token: str, n: int) -> int:
    return int(hashlib.sha256(token.encode()).hexdigest()[:8], 16) % n


def turn_script(token: str, http_port: int) -> tuple[str, list[str]]:
    """A turn's script (the scripted model plays it) and the kinds of tool call in it: three calls
    from the mix, rotating by the token, then the final answer."""
    kinds = ["send_email", "write_file", "run_command", "http_request", CLIENT_TOOL]
    start = _pick(token, len(kinds))
    chosen = [kinds[(start + i) % len(kinds)] for i in range(3)]
    lines = [f"chaos turn {token}"]
    for n, kind in enumerate(chosen):
        tag = f"{token}-{n}"
        if kind == "send_email":
            args: dict[str, Any] = {"to": "ops@example.com", "subject": f"chaos {tag}", "body": "status"}
        elif kind == "write_file":
            args = {"path": f"notes/{tag}.txt", "content": f"note {tag}\n"}
        elif kind == "run_command":
            # Append-only with a token of its own: a second run leaves a second line. The sleep
            # after the write keeps the command in flight (and the workspace changed) for a while.
            args = {"command": f"echo {tag} >> runs.log; sleep 0.5"}
        elif kind == "http_request":
            args = {"method": "POST", "url": f"http://127.0.0.1:{http_port}/hit/{tag}", "body": "{}"}
        else:
            args = {"question": f"proceed with {tag}?"}
        lines.append(f"sleep {50 + _pick(tag, 250)}")
        lines.append(f"tool {kind} {json.dumps(args)}")
    lines.append(f"say done {token}")
    return "\n".join(lines), chosen


class Api:
    """The public API as an integration calls it: retried across a dead daphne, POSTs with a key."""

    def __init__(self, base: str, token: str) -> None:
        self.http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        self.errors: Counter[str] = Counter()

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, key: str = "",
             ok: tuple[int, ...] = (200, 201), patience: float = 60.0) -> Any:
        deadline = time.monotonic() + patience
        headers = {"Idempotency-Key": key} if key else {}
        while True:
            try:
                response = self.http.request(method, path, json=body, headers=headers)
                if response.status_code in ok:
                    return response.json()
                self.errors[f"{method} HTTP {response.status_code}"] += 1
                if response.status_code < 500 and response.status_code not in (409, 429):
                    return None  # refused for good (e.g. a decision raced another): the caller moves on
            except httpx.HTTPError as exc:
                self.errors[f"{method} {type(exc).__name__}"] += 1
            if time.monotonic() > deadline:
                return None
            time.sleep(0.3)


class Chaos(threading.Thread):
    """Kills a random process every few seconds and restarts it; restarts Redis and cuts
    PostgreSQL's connections at planned moments."""

    def __init__(self, stack: Stack, kills: int, redis_restarts: int, seconds: float, admin_dsn: str,
                 database: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.stack, self.target_kills, self.seconds = stack, kills, seconds
        self.redis_at = [seconds * (i + 1) / (redis_restarts + 1) for i in range(redis_restarts)]
        self.redis_planned = redis_restarts
        self.postgres_at: float | None = seconds * 0.45
        self.admin_dsn, self.database = admin_dsn, database
        self.random = random.Random(seed)
        self.stopping = threading.Event()
        self.log: list[tuple[float, str]] = []
        self.killed: Counter[str] = Counter()
        self.redis_restarts = 0
        self.postgres_terminated = 0
        self.error = ""

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # reported, and the proof fails on it
            self.error = f"{type(exc).__name__}: {exc}"

    def _run(self) -> None:
        start = time.monotonic()
        gap = self.seconds / max(1, self.target_kills)
        while not self.stopping.is_set() and sum(self.killed.values()) < self.target_kills:
            self.stopping.wait(self.random.uniform(0.4 * gap, 1.2 * gap))
            if self.stopping.is_set():
                break
            now = time.monotonic() - start
            if self.redis_at and now >= self.redis_at[0]:
                self.redis_at.pop(0)
                self.stack.restart("redis")
                self.redis_restarts += 1
                self.log.append((now, "restarted redis (everything in it lost)"))
            if self.postgres_at is not None and now >= self.postgres_at:
                self.postgres_at = None
                self.postgres_terminated = self._terminate_backends()
                self.log.append((now, f"terminated {self.postgres_terminated} PostgreSQL backends"))
            name = self.random.choice(KILLABLE)
            self.stack.kill(name)
            self.killed[name] += 1
            self.log.append((now, f"SIGKILL {name}"))
            self.stopping.wait(self.random.uniform(0.3, 1.5))
            self.stack.spawn(name)

    def _terminate_backends(self) -> int:
        import psycopg

        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE datname = %s AND pid <> pg_backend_pid()", [self.database]).fetchall()
        return sum(1 for (ok,) in rows if ok)


def run(full: bool = False) -> Result:
    size = ({"sessions": 25, "turns": 4, "kills": 24, "redis": 2, "seconds": 240, "ws": 2, "sse": 1} if full else
            {"sessions": 8, "turns": 2, "kills": 6, "redis": 1, "seconds": 60, "ws": 1, "sse": 1})
    seed = int(os.environ.get("PROOF_SEED", "13"))
    rnd = random.Random(seed)
    name = os.environ.get("PROOF_CHAOS_DATABASE", "agentops_proof_chaos")
    url = database_url(name)
    result = Result("chaos")
    total_turns = size["sessions"] * size["turns"]
    print(f"chaos ({'full' if full else 'short'} size)")
    print(f"  machine    {machine()}")
    print(f"  database   {url} (created for this proof, dropped at the end)")
    print(f"  work       {size['sessions']} sessions × {size['turns']} turns = {total_turns} turns, each 3 tool "
          f"calls from send_email, write_file, run_command, http_request, {CLIENT_TOOL} (client tool)")
    print(f"  chaos      {size['kills']} SIGKILLs of {', '.join(KILLABLE)} over ~{size['seconds']} s, "
          f"{size['redis']} Redis restart(s), 1 pg_terminate_backend of every connection; seed {seed}")
    recreate_database(url)
    workspaces = Path(tempfile.mkdtemp(prefix="agentops-proof-ws-", dir="/var/tmp"))
    workspaces.chmod(0o711)
    counting = Counting()
    stack = Stack(database_url=url, workspaces=workspaces, extra_env={
        "AGENTOPS_SWEEP_SECONDS": "2", "AGENTOPS_LEASE_SECONDS": "10", "AGENTOPS_GATEWAY_RECLAIM_SECONDS": "5",
        "AGENTOPS_HTTP_ALLOWED_HOSTS": "127.0.0.1", "AGENTOPS_HTTP_ALLOW_PRIVATE": "true"},
        # Two web processes, as make run (PROOF_CHAOS_WEB_PROCESSES to change it): the one that
        # outlives a Redis restart must keep its clients live (agentops.channel_layer).
        web_processes=int(os.environ.get("PROOF_CHAOS_WEB_PROCESSES", "2")))
    watchers = None
    try:
        django_setup(url)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        tokens = world_setup("chaos", stack.model_url)
        from django.db import connections

        connections.close_all()
        stack.start()
        print(f"  stack      up: {', '.join(stack.procs)}; logs in {stack.logs}")
        operator, reviewer = Api(stack.url, tokens["operator"]), Api(stack.url, tokens["reviewer"])
        watchers = start_watchers(stack.url, size["ws"], size["sse"])
        report = _drive(stack, size, operator, reviewer, counting, watchers, rnd, url, name, seed, result)
        print()
        _verify(report, stack, counting, workspaces, result)
    finally:
        if watchers is not None and watchers.poll() is None:
            watchers.kill()
        stack.stop()
        counting.server.shutdown()
        from django.db import connections

        connections.close_all()
        drop_database(url)
        shutil.rmtree(workspaces, ignore_errors=True)
        shutil.rmtree(str(workspaces) + "-artifacts", ignore_errors=True)
    if result.ok:
        stack.remove_logs()
    else:
        print(f"  logs kept in {stack.logs}")
    print()
    print_verdicts(result)
    return result


def _round(sessions: dict[str, dict[str, Any]], size: dict[str, int], operator: Api, reviewer: Api,
           counting: Counting, decisions: Counter[str], decided: set[str], answered: set[str], seed: int) -> int:
    """One round of the bots: decide pending approvals, answer client tools, start the next turns.
    Returns how many sessions still have a turn open (or one to start)."""
    from django.db import close_old_connections

    from approvals_app.models import ApprovalRequest
    from sessions_app.models import Step, Turn

    close_old_connections()
    # The reviewer bot: every pending request, through the API.
    for approval in ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING,
                                                   session_id__in=list(sessions)):
        rid = str(approval.request_id)
        if rid in decided:
            continue
        body: dict[str, Any] = {"arguments_sha256": approval.arguments_sha256}
        if approval.kind == ApprovalRequest.Kind.RECOVERY:
            # The reviewer's judgement, as a person would make it: a command's effect is in the
            # workspace (done); an HTTP request carries its idempotency key (safe to send again).
            body["decision"] = "retry" if approval.tool_name == "http_request" else "mark_done"
            body["reason"] = "chaos proof reviewer"
        else:
            roll = _pick(rid, 10)
            if roll == 0:
                body.update(decision="reject", reason="not now (chaos proof)")
            elif roll == 1 and approval.tool_name in ("write_file", "send_email"):
                edited = dict(approval.arguments)
                key = "content" if approval.tool_name == "write_file" else "body"
                edited[key] = str(edited.get(key, "")) + " (edited by the reviewer)"
                body.update(decision="approve", arguments=edited)
            else:
                body["decision"] = "approve"
        label = f"{approval.kind}:{body['decision']}{'+edit' if 'arguments' in body else ''}"
        # Not decided (daphne down, a refusal): it is still pending next round, and tried again.
        if reviewer.call("POST", f"/api/approvals/{rid}/decision", body, patience=5) is not None:
            decisions[label] += 1
            decided.add(rid)
    # The client bot: the client tool's output.
    for step in Step.objects.filter(tool_name=CLIENT_TOOL, status=Step.Status.RUNNING,
                                    session_id__in=list(sessions)):
        if str(step.id) in answered:
            continue
        done = operator.call("POST", f"/api/sessions/{step.session_id}/tool-outputs",
                             {"call_id": step.call_id, "output": {"answer": "yes"}},
                             key=f"chaos-out-{step.id}", patience=5)
        if done is not None:
            answered.add(str(step.id))
    # The operator: the next turn of a session whose turn ended.
    latest = {str(t.session_id): t for t in Turn.objects.filter(session_id__in=list(sessions)).order_by("index")}
    open_turns = 0
    for sid, state in sessions.items():
        turn = latest.get(sid)
        if turn is None or turn.is_active:
            open_turns += 1
            continue
        if len(state["turns"]) < size["turns"]:
            token = f"s{list(sessions).index(sid):03d}t{len(state['turns'])}"
            script, kinds = turn_script(token, counting.port)
            if operator.call("POST", f"/api/sessions/{sid}/turns", {"input": script},
                             key=f"chaos-turn-{seed}-{token}", patience=20) is not None:
                state["turns"].append(token)
                state["kinds"] += kinds
            open_turns += 1
    return open_turns


def _drive(stack: Stack, size: dict[str, int], operator: Api, reviewer: Api, counting: Counting,
           watchers: subprocess.Popen[str], rnd: random.Random, url: str, database: str, seed: int,
           result: Result) -> dict[str, Any]:
    """Start the work and the chaos; decide, answer and continue until every turn ended."""
    from urllib.parse import urlsplit, urlunsplit

    from django.db import InterfaceError, OperationalError, connections

    parts = urlsplit(url)
    admin = urlunsplit(("postgresql", parts.netloc, "/postgres", "", ""))
    sessions: dict[str, dict[str, Any]] = {}
    decisions: Counter[str] = Counter()
    answered: set[str] = set()
    decided: set[str] = set()
    for n in range(size["sessions"]):
        token = f"s{n:03d}t0"
        script, kinds = turn_script(token, counting.port)
        created = operator.call("POST", "/api/sessions", {"agent": "chaos", "title": f"chaos {n}", "input": script},
                                key=f"chaos-session-{seed}-{n}")
        if created is None:
            raise RuntimeError(f"could not start session {n}: {operator.errors}")
        sessions[str(created["id"])] = {"turns": [token], "kinds": kinds}
        assert watchers.stdin is not None
        watchers.stdin.write(str(created["id"]) + "\n")
        watchers.stdin.flush()
    chaos = Chaos(stack, size["kills"], size["redis"], size["seconds"], admin, database, seed)
    chaos.start()
    started = time.monotonic()
    limit = size["seconds"] + (240 if size["sessions"] > 10 else 150)
    finished = False
    while time.monotonic() - started < limit:
        try:
            open_turns = _round(sessions, size, operator, reviewer, counting, decisions, decided, answered, seed)
        except (OperationalError, InterfaceError):  # our own connection was cut too (pg_terminate_backend)
            connections.close_all()
            time.sleep(0.3)
            continue
        if open_turns == 0 and not chaos.is_alive():
            finished = True
            break
        for name in stack.dead():
            if name not in KILLABLE and name != "redis":
                raise RuntimeError(f"{name} died:\n{stack.tail(name)}")
        time.sleep(0.3)
    chaos.stopping.set()
    chaos.join(timeout=30)
    took = time.monotonic() - started
    # Replay: every client asks for everything after its last seq, then stops.
    assert watchers.stdin is not None
    time.sleep(2)
    watchers.stdin.write("replay\n")
    watchers.stdin.flush()
    from django.db import close_old_connections

    from sessions_app.models import AgentSession

    close_old_connections()
    for session_id, last in AgentSession.objects.filter(pk__in=list(sessions)).values_list("id", "last_seq"):
        watchers.stdin.write(f"expect {session_id} {last}\n")  # the drain waits for the replays to land
    time.sleep(3)
    watchers.stdin.write("stop\n")
    watchers.stdin.flush()
    out, _ = watchers.communicate(timeout=60)
    clients = json.loads(out.strip().splitlines()[-1])
    return {"sessions": sessions, "decisions": decisions, "chaos": chaos, "took": took, "finished": finished,
            "clients": clients, "api_errors": operator.errors + reviewer.errors}


def _verify(report: dict[str, Any], stack: Stack, counting: Counting, workspaces: Path, result: Result) -> None:
    from django.db import close_old_connections, connection

    from approvals_app.models import ApprovalRequest
    from sessions_app.models import AgentSession, Event, Step, Turn
    from tools_app.models import Outbox

    close_old_connections()
    chaos: Chaos = report["chaos"]
    sessions: dict[str, dict[str, Any]] = report["sessions"]
    ids = [uuid.UUID(sid) for sid in sessions]
    print("chaos log:")
    for at, what in chaos.log:
        print(f"  {at:6.1f} s  {what}")
    if chaos.error:
        print(f"  chaos loop error: {chaos.error}")
    kills = sum(chaos.killed.values())
    print(f"  {kills} kills ({', '.join(f'{k} {v}' for k, v in sorted(chaos.killed.items()))}), "
          f"{chaos.redis_restarts} Redis restarts, {chaos.postgres_terminated} PostgreSQL backends terminated; "
          f"work took {report['took']:.0f} s")
    turns = list(Turn.objects.filter(session_id__in=ids))
    planned = len(ids) * max(len(s["turns"]) for s in sessions.values())
    statuses = Counter(t.status for t in turns)
    lost = [t for t in turns if t.is_active]
    missing = planned - len(turns)
    errors = Counter(t.error_code for t in turns if t.status == Turn.Status.FAILED)

    # Emails: one outbox row per subject token (each planned email has its own), never two.
    subjects = Counter(Outbox.objects.values_list("subject", flat=True))
    duplicate_emails = sum(n - 1 for n in subjects.values() if n > 1)
    # External requests: a token applied under two keys would be a second effect; the same key
    # twice is a delivery the server de-duplicated (a reviewer's retry after in_doubt).
    duplicate_effects = sum(len(keys) - 1 for keys in counting.keys_of_token.values() if len(keys) > 1)
    redelivered = sum(n - 1 for n in counting.by_key.values() if n > 1)
    keyless = counting.by_key.get("", 0)
    # Commands: each token must appear at most once in its session's runs.log.
    reruns = 0
    runs_total = 0
    for session in AgentSession.objects.filter(pk__in=ids):
        log = Path(session.workspace) / "runs.log" if session.workspace else None
        if log is not None and log.exists():
            lines = Counter(line.strip() for line in log.read_text().splitlines() if line.strip())
            runs_total += len(lines)
            reruns += sum(n - 1 for n in lines.values() if n > 1)
    in_doubt_commands = ApprovalRequest.objects.filter(session_id__in=ids, kind=ApprovalRequest.Kind.RECOVERY,
                                                       tool_name="run_command").count()
    # Events gap-free: seq 1..last_seq, each once, per session.
    with connection.cursor() as cur:
        cur.execute("""SELECT count(*) FROM sessions_app_agentsession s
                       WHERE s.id = ANY(%s) AND (s.last_seq <> (SELECT count(*) FROM sessions_app_event e
                                                                WHERE e.session_id = s.id)
                          OR s.last_seq <> (SELECT coalesce(max(seq), 0) FROM sessions_app_event e
                                            WHERE e.session_id = s.id))""", [ids])
        gappy = cur.fetchone()[0]
    last_seq = dict(AgentSession.objects.filter(pk__in=ids).values_list("id", "last_seq"))
    clients = report["clients"]["clients"]
    incomplete = [c for c in clients if set(c["seqs"]) != set(range(1, last_seq[uuid.UUID(c["session"])] + 1))]
    dup_deliveries = sum(c["duplicates"] for c in clients)
    events_total = sum(last_seq.values())
    latencies = report["clients"]["latencies_ms"]

    recovered = Counter(str((p or {}).get("outcome")) + " " + str((p or {}).get("kind")) + (
        f"/{(p or {}).get('tool')}" if (p or {}).get("tool") else "")
        for p in Event.objects.filter(session_id__in=ids, type="step.recovered").values_list("payload", flat=True))
    recovery_requests = Counter(ApprovalRequest.objects.filter(session_id__in=ids, kind=ApprovalRequest.Kind.RECOVERY)
                                .values_list("tool_name", flat=True))
    attempts = Counter(Step.objects.filter(session_id__in=ids, attempts__gt=1).values_list("kind", flat=True))

    print("work:")
    print_table(["what", "count"], [
        ["turns planned / created", f"{planned} / {len(turns)}"],
        *[[f"turns {k}", v] for k, v in sorted(statuses.items())],
        *[[f"failed turns: {k or '(no code)'}", v] for k, v in sorted(errors.items())],
        *[[f"decision {k}", v] for k, v in sorted(report["decisions"].items())],
        ["emails sent (outbox rows)", sum(subjects.values())],
        ["external requests received / distinct keys", f"{sum(counting.by_key.values())} / {len(counting.by_key)}"],
        ["commands run (distinct tokens in runs.log)", runs_total],
        ["events stored", events_total],
        ["clients (WebSocket + SSE)", len(clients)],
        ["client reconnects / gaps asked again", f"{sum(c['reconnects'] for c in clients)} / "
                                                  f"{sum(c['gaps'] for c in clients)}"],
        ["events a client got only from the final replay", sum(c.get("by_replay", 0) for c in clients)],
        ["push latency p50 / p99 (live events)", f"{percentile(latencies, 50):.0f} / {percentile(latencies, 99):.0f} ms"
         if latencies else "-"],
        *[[f"API retries: {k}", v] for k, v in sorted(report["api_errors"].items())],
    ])
    print("recovery paths taken:")
    print_table(["path", "count"], [
        *[[f"step.recovered: {k}", v] for k, v in sorted(recovered.items())],
        *[[f"recovery request (in_doubt): {k}", v] for k, v in sorted(recovery_requests.items())],
        *[[f"steps run more than once: {k}", v] for k, v in sorted(attempts.items())],
        ["HTTP deliveries de-duplicated by Idempotency-Key", redelivered],
        ["process restarts (after SIGKILL)", kills],
    ])
    result.check("chaos ran: ≥ planned kills, Redis restarts, one PostgreSQL cut",
                 f"{kills} kills, {chaos.redis_restarts} Redis, {chaos.postgres_terminated} backends cut",
                 not chaos.error and kills >= chaos.target_kills and chaos.redis_restarts == chaos.redis_planned
                 and chaos.postgres_terminated > 0)
    result.check("0 lost turns (every turn created and ended, none stuck)",
                 f"{len(lost)} still active, {missing} never created, {len(turns)} ended of {planned}",
                 not lost and missing == 0 and report["finished"])
    result.check("0 duplicate emails", f"{duplicate_emails}", duplicate_emails == 0)
    result.check("0 duplicate external requests (effects)",
                 f"{duplicate_effects} (requests without a key: {keyless})", duplicate_effects == 0 and keyless == 0)
    result.check("0 commands re-run after they changed the workspace",
                 f"{reruns} re-runs; {in_doubt_commands} commands in_doubt with a recovery request", reruns == 0)
    result.check("every session's events gap-free", f"{gappy} sessions with a gap", gappy == 0)
    result.check("every client got every event (once, after replay)",
                 f"{len(incomplete)} of {len(clients)} clients incomplete; {dup_deliveries} duplicate deliveries "
                 "dropped by clients", not incomplete and bool(clients))
    if incomplete:
        for c in incomplete[:5]:
            want = set(range(1, last_seq[uuid.UUID(c["session"])] + 1))
            print(f"  incomplete {c['kind']} client of {c['session'][:8]}: missing {sorted(want - set(c['seqs']))[:10]}"
                  f" errors {c['errors']}")
    if lost:
        for t in lost[:5]:
            print(f"  stuck turn {t.id} of {t.session_id}: {t.status}")
            print("    steps: " + ", ".join(f"{s.index}:{s.kind}/{s.tool_name}={s.status}"
                                           for s in Step.objects.filter(turn=t).order_by("index")))
        for name in KILLABLE:
            tail = stack.tail(name, 1500)
            if re.search(r"Traceback|ERROR", tail):
                print(f"--- {name} log tail ---\n{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="100 turns, ≥ 20 kills, 2 Redis restarts")
    args = parser.parse_args()
    raise SystemExit(0 if run(full=args.full).ok else 1)


if __name__ == "__main__":
    main()
