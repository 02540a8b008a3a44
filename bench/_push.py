"""The WebSocket watchers' report (``_watchers.py``) summed up for ``concurrency.py``: push latency,
where it went stage by stage and in the worst 2-s window, the deliveries after the creation
burst, how long the watchers took to open, and what was lost after replay."""

import uuid
from typing import Any

from _harness import pct


def summary(report: dict[str, Any], created_by: float) -> dict[str, Any]:
    """The watchers' report, summed up; ``created_by``: when the last session had been created
    (Unix time), to tell the deliveries during the creation burst from those after it."""
    from sessions_app.models import AgentSession

    last = dict(AgentSession.objects.filter(pk__in={sid for sid, _, _ in report["per_client"]})
                .values_list("id", "last_seq"))
    lost = sum(max(0, last.get(uuid.UUID(sid), 0) - count) for sid, count, _ in report["per_client"])
    short = [(sid[:8], count, last.get(uuid.UUID(sid))) for sid, count, _ in report["per_client"]
             if count < last.get(uuid.UUID(sid), 0)]
    if report.get("silent"):
        print(f"  (watchers that never got a message: (session, connected after s) {report['silent']})")
    if short:
        print(f"  (watchers short of events: {len(short)}, e.g. (session, received, stored) {short[:3]})")
    lat = report["latencies_ms"]
    stages = report.get("stages_ms") or []
    names = ["created → committed", "→ picked by the announcer", "→ listeners checked", "→ rendered",
             "→ sent", "→ taken by daphne's consumer", "→ received by the client"]
    if stages:  # where a delivery's time went, stage by stage
        print("  push stages (p50 / p99 ms): " + "; ".join(
            f"{name} {pct([x[i] for x in stages], 0.5):.1f} / {pct([x[i] for x in stages], 0.99):.1f}"
            for i, name in enumerate(names)))
    at = report.get("received_at") or []
    if at and len(at) == len(lat):  # the tail, by 2-s window from the first delivery
        start = min(at)
        windows: dict[int, list[float]] = {}
        for t, ms in zip(at, lat, strict=True):
            windows.setdefault(int((t - start) // 2), []).append(ms)
        print("  push p99 by 2-s window (ms): " + ", ".join(
            f"{2 * w}-{2 * w + 2} s {pct(v, 0.99):.0f}" for w, v in sorted(windows.items())))
        worst = max(windows, key=lambda w: pct(windows[w], 0.99))
        in_worst = [x for x in stages if len(x) == len(names) + 2 and int((x[-2] - start) // 2) == worst]
        if in_worst:
            print(f"  stages in the worst window ({2 * worst}-{2 * worst + 2} s), p99 ms: " + "; ".join(
                f"{name} {pct([x[i] for x in in_worst], 0.99):.1f}" for i, name in enumerate(names)))
            by_type: dict[str, list[list[Any]]] = {}
            for x in in_worst:
                by_type.setdefault(str(x[-1]), []).append(x)
            print("  the worst window by event type (deliveries; created → received p99 ms; its slowest stage): "
                  + "; ".join(f"{kind} {len(xs)}; {pct([sum(x[:len(names)]) for x in xs], 0.99):.0f}; "
                              + names[max(range(len(names)), key=lambda i: pct([x[i] for x in xs], 0.99))]
                              for kind, xs in sorted(by_type.items())))
    after = [ms for t, ms in zip(at, lat, strict=True) if t > created_by] if len(at) == len(lat) else []
    opening = report.get("opening_ms") or []
    if opening:  # the events before a watcher's hello come in its backlog, outside the latencies
        print("  watchers' WebSockets, from the session handed over: open p50 / p99 "
              f"{pct([o for o, _ in opening], 0.5):.0f} / {pct([o for o, _ in opening], 0.99):.0f} ms, "
              f"first message (the backlog) {pct([f for _, f in opening], 0.5):.0f} / "
              f"{pct([f for _, f in opening], 0.99):.0f} ms; live deliveries per watcher "
              f"{len(lat) / max(1, report['clients']):.1f}")
    return {"clients": report["clients"], "deliveries": len(lat), "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
            "after_creation": (len(after), pct(after, 0.5), pct(after, 0.99)),
            "max": max(lat) if lat else float("nan"), "gaps_replayed": report["gaps"], "lost": lost,
            "reconnects": report["reconnects"],
            "errors": report["errors"][:3]}
