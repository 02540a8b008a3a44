"""A long session: compaction keeps every prompt under the window, pinned context verbatim.

Usage: .venv/bin/python -m agentops.embedded_redis -- .venv/bin/python bench/long_session.py [N ...]
       (default: 100 500)
Env:   DATABASE_URL (only its server is used: the benchmark works in its own database
       BENCH_DATABASE_NAME, default bench_agentops); REDIS_URL (the embedded one above).

One turn whose scripted model asks for N ``read_file`` calls of a 16 KiB file, one per reply, then
says "done" (N + 1 model calls, N tool steps), through the real processes: session_start → a
Celery worker subprocess and a model gateway subprocess (``_harness.Worker``) → the scripted model
as its own process (``python -m scripted_model``) over HTTP, on PostgreSQL.

- compaction on: the agent's window is 32,768 tokens (threshold 0.8, 4 recent steps kept) and the
  scripted model enforces the same window (``--context-window 32768``): a prompt over it would be
  answered 400 ``context_length_exceeded``.
- compaction off: no window on the agent, a scripted model without a window: every call resends
  the whole history (what the product did before compaction).

Printed, from the model's request log (``GET /_log``) and the database of the same run: every
request's size against the window, the pinned items found verbatim in each request (the turn's
answer is verified against the acceptance criterion: one verification call per run), total prompt
tokens on vs off (and off computed from the same history, prefix by prefix), the compaction
steps' share of all tokens, and engine ms/step on vs off at each N (wall time of the turn per
step, and the same less the model server's own time per request).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Worker, bench_agent, cleanup_workspaces, configure  # noqa: E402
from _stack import free_port, wait_http  # noqa: E402

DEFAULT_NS = (100, 500)
WINDOW = 32_768
TOOL_OUTPUT_BYTES = 16 * 1024
KEEP_RECENT_STEPS = 4
TURN_TIMEOUT_SECONDS = 900.0
PINNED = {"requirements": ["Keep the public API backwards compatible (REQ-7f3a)."],
          "prohibitions": ["Never write to the production database (PRO-91c2)."],
          "acceptance_criteria": ["The agent reports that it is `done` (ACC-5d10)."]}


def big_file() -> str:
    line = "0123456789abcdef" * 4 + "\n"  # 65 characters
    text = "".join(f"{i:06d} {line}" for i in range(TOOL_OUTPUT_BYTES // (len(line) + 7) + 1))
    return text[:TOOL_OUTPUT_BYTES]


def script(n: int) -> str:
    return "\n".join(['tool read_file {"path": "big.txt"}'] * n + ["say done"])


class Model:
    """The scripted model as a process of its own, with or without a context window."""

    def __init__(self, window: int | None) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/v1"
        self.log = Path(tempfile.mkstemp(prefix="agentops-bench-model-", suffix=".log")[1])
        args = [sys.executable, "-m", "scripted_model", "--port", str(port), "--quiet"]
        if window:
            args += ["--context-window", str(window)]
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        wait_http(self.url + "/models", proc=self.proc)

    def requests(self, after: int = 0) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url.removesuffix("/v1") + f"/_log?after={after}", timeout=60) as r:
            entries: list[dict[str, Any]] = json.loads(r.read())
            return entries

    def last_seq(self) -> int:
        entries = self.requests()
        return entries[-1]["seq"] if entries else 0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.unlink(missing_ok=True)


def run_turn(profile: Any, owner: Any, n: int, worker: Worker) -> tuple[Any, float]:
    """Start the session, wait for the turn; (turn, wall ms from session_start to finished_at)."""
    from sessions_app.engine.commands import session_start
    from sessions_app.models import Step, Turn

    started = time.time()
    _, turn = session_start(agent=profile, owner=owner, input=script(n), title=f"long session N={n}", pinned=PINNED)
    assert turn is not None
    deadline = time.monotonic() + TURN_TIMEOUT_SECONDS
    while True:
        row = Turn.objects.get(pk=turn.pk)
        if row.status not in Turn.ACTIVE:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"N={n}: the turn did not finish in {TURN_TIMEOUT_SECONDS:.0f} s;\n" + worker.tail())
        worker.check()
        time.sleep(0.1)
    tools = Step.objects.filter(turn=row, kind=Step.Kind.TOOL, status=Step.Status.COMPLETED).count()
    if (row.status != Turn.Status.COMPLETED or row.output_text != "done" or row.criteria_unmet or tools != n
            or row.finished_at is None):
        raise SystemExit(f"N={n}: the turn ended {row.status} {row.error_code} {row.error_message[:300]!r} "
                         f"output={row.output_text[:80]!r} tool steps={tools};\n" + worker.tail())
    return row, (row.finished_at.timestamp() - started) * 1000


def uncompacted_prompt_tokens(session: Any) -> int:
    """What the same session costs without compaction: at each model call, the whole history up to
    it (the full history rebuilt from the database, summed prefix by prefix, chars / 4)."""
    from sessions_app.engine.context import message_chars, tokens_of
    from sessions_app.engine.prompt import build_messages

    total, prefix = 0, 0
    messages = build_messages(session, latest=False)
    for message in messages:
        if message["role"] == "assistant":
            total += tokens_of(prefix)
        prefix += message_chars(message)
    return total


def measure(label: str, n: int, profile: Any, owner: Any, model: Model, worker: Worker) -> dict[str, Any]:
    from django.db.models import Sum

    from sessions_app.models import AgentSession, Step

    after = model.last_seq()
    turn, wall_ms = run_turn(profile, owner, n, worker)
    sent = model.requests(after)
    session = AgentSession.objects.select_related("agent").get(pk=turn.session_id)
    steps = Step.objects.filter(session=session)
    sums = {kind: steps.filter(kind=kind).aggregate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
            for kind in ("model", "compaction", "verification")}
    model_ms = sum((e["finished_at"] - e["received_at"]) * 1000 for e in sent)
    pinned = [item for items in PINNED.values() for item in items]
    return {
        "label": label, "n": n, "session": session, "wall_ms": wall_ms, "model_ms": model_ms,
        "requests": len(sent), "chat": sum(e["purpose"] == "chat" for e in sent),
        "verifications": sum(e["purpose"] == "verification" for e in sent),
        "compactions": sum(e["purpose"] == "compaction" for e in sent),
        "refused": sum(e["status"] != 200 for e in sent),
        "max_prompt": max(e["prompt_tokens"] for e in sent),
        "pinned_ok": sum(all(item in e["system"] for item in pinned) for e in sent),
        "prompt_tokens": sum(e["prompt_tokens"] for e in sent),
        "model_tokens": (sums["model"]["p"] or 0) + (sums["model"]["c"] or 0),
        "compaction_tokens": (sums["compaction"]["p"] or 0) + (sums["compaction"]["c"] or 0),
        "verification_tokens": (sums["verification"]["p"] or 0) + (sums["verification"]["c"] or 0),
    }


def main() -> None:
    ns = tuple(int(a) for a in sys.argv[1:]) or DEFAULT_NS
    configure()
    windowed, open_model = Model(WINDOW), Model(None)
    worker = Worker()
    ok = False
    try:
        worker.start()
        on_profile, owner = bench_agent("bench-long-on", windowed.url)
        off_profile, _ = bench_agent("bench-long-off", open_model.url)
        on_profile.context_window, on_profile.keep_recent_steps = WINDOW, KEEP_RECENT_STEPS
        on_profile.compaction_threshold = 0.8
        off_profile.context_window = None
        for profile in (on_profile, off_profile):
            profile.starter_files = {"big.txt": big_file()}
            profile.save()
        measure("warm-up", 5, on_profile, owner, windowed, worker)
        rows = []
        for n in ns:
            rows.append(measure("on", n, on_profile, owner, windowed, worker))
            rows.append(measure("off", n, off_profile, owner, open_model, worker))
        report(rows)
        ok = True
    finally:
        worker.stop(keep_log=not ok)
        windowed.stop()
        open_model.stop()
        cleanup_workspaces()


def report(rows: list[dict[str, Any]]) -> None:
    print(f"long session: N read_file steps of {TOOL_OUTPUT_BYTES} B each, window {WINDOW} tokens "
          f"(threshold 0.8, {KEEP_RECENT_STEPS} recent steps kept); tokens = characters / 4")
    print(f"{'run':<5} {'N':>4} {'requests':>8} {'compactions':>11} {'refused':>7} {'max prompt':>10} "
          f"{'pinned':>9} {'prompt tokens':>13} {'ms/step':>8} {'engine ms/step':>14}")
    for r in rows:
        print(f"{r['label']:<5} {r['n']:>4} {r['requests']:>8} {r['compactions']:>11} {r['refused']:>7} "
              f"{r['max_prompt']:>10} {r['pinned_ok']:>4}/{r['requests']:<4} {r['prompt_tokens']:>13,} "
              f"{r['wall_ms'] / r['n']:>8.1f} {(r['wall_ms'] - r['model_ms']) / r['n']:>14.1f}")
    by = {(r["label"], r["n"]): r for r in rows}
    for n in sorted({r["n"] for r in rows}):
        on, off = by[("on", n)], by[("off", n)]
        computed = uncompacted_prompt_tokens(on["session"])
        total = on["model_tokens"] + on["compaction_tokens"] + on["verification_tokens"]
        print(f"N={n}: every request under the window: {on['max_prompt'] <= WINDOW and on['refused'] == 0} "
              f"(max {on['max_prompt']} of {WINDOW}); pinned verbatim in {on['pinned_ok']}/{on['requests']} "
              f"requests ({100 * on['pinned_ok'] / on['requests']:.0f} %)")
        print(f"N={n}: prompt tokens on/off = {on['prompt_tokens']:,} / {off['prompt_tokens']:,} = "
              f"{on['prompt_tokens'] / off['prompt_tokens']:.3f}x (off computed from the same history: "
              f"{computed:,}, {on['prompt_tokens'] / computed:.3f}x); compaction steps: {on['compactions']}, "
              f"{on['compaction_tokens']:,} of {total:,} tokens ({100 * on['compaction_tokens'] / total:.1f} %)")
        print(f"N={n}: engine ms/step on {(on['wall_ms'] - on['model_ms']) / n:.1f} vs off "
              f"{(off['wall_ms'] - off['model_ms']) / n:.1f} "
              f"(wall {on['wall_ms'] / n:.1f} vs {off['wall_ms'] / n:.1f})")


if __name__ == "__main__":
    main()
