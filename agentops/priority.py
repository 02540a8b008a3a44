"""The CPU priority of background processes: when the cores are short, the web answers first and
the agent work queues (and finishes later), rather than every request waiting behind it.

The background roles are the Celery workers (engine ticks, sandboxed commands, beat) and the model
gateway; daphne and the announcer (which sends live events) keep the normal priority. A launcher
(``make run``, the proofs' and benchmarks' stacks) calls ``background(pid)`` on each background
child it has just started in a session of its own. Two settings, because Linux schedules by
session first: with autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``, on by
default in most distributions) CFS shares the CPU between sessions by their autogroup's nice
value, and a process's own nice value counts only against processes of its session; so both are
lowered (the autogroup's covers every thread and child of the session).

Measured with the load proof (``python -m proof --full load``, 2 cores, 2026-12-02): with every
process at the same priority, 5,084 of 6,000 requests were answered within 30 s and the rest timed
out, the web processes at 37 % of a core each, waiting for the CPU behind the gateway and the
workers; with the background at nice 10, 6,000 of 6,000, p50 40 ms, p99 249 ms. Lowering each
process's nice value alone changed nothing (4,839 of 6,000): autogroup scheduling ignored it.

``$AGENTOPS_BACKGROUND_NICE`` (default 10; 0 leaves the priority alone). On several machines, give
the background roles the same priority with the service manager (systemd ``Nice=10`` or
``CPUWeight=``) where they share a machine with daphne; the README's layout says so.
"""

import contextlib
import os
from pathlib import Path

DEFAULT_BACKGROUND_NICE = 10


def background_nice() -> int:
    """``$AGENTOPS_BACKGROUND_NICE`` clamped to 0..19, default DEFAULT_BACKGROUND_NICE."""
    return max(0, min(19, int(os.environ.get("AGENTOPS_BACKGROUND_NICE", DEFAULT_BACKGROUND_NICE))))


def background(pid: int, nice: int | None = None) -> None:
    """Lower the priority of process ``pid`` (a child started with ``start_new_session=True``, so
    its session is its own) by ``nice``: its own nice value and its session's autogroup. Raising
    a nice value needs no privilege; where either is unsupported (not Linux, autogroup off) it is
    left as it is."""
    nice = background_nice() if nice is None else nice
    if nice <= 0:
        return
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)  # type: ignore[attr-defined,unused-ignore]
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def autogroup_nice(pid: int) -> int | None:
    """The autogroup nice value of ``pid``'s session, or None where there is none (what
    ``background`` set, read back; tests/agentops/test_priority.py)."""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text()
    except OSError:
        return None
    return int(text.rsplit("nice", 1)[1]) if "nice" in text else None
