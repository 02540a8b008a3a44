"""Process tuning shared by the long-running processes (daphne, Celery workers, model gateways).

Garbage collection: full passes over a Django process's start-up objects cost tens of
milliseconds (measured here: 46-62 ms, the tail of every live push). ``gc.freeze()`` after
start-up moves those objects out of the collector's view, and a larger first-generation threshold
makes collections rarer; the processes are long-lived and allocate in bursts.

The GIL's switch interval: a thread woken by I/O (the announcer's Redis replies, a database
answer) waits until the thread holding the GIL gives it up, up to ``sys.getswitchinterval()``
(5 ms by default) each time. An announcement makes about ten round trips (listeners, the
fragments' queries, the sends) in a process whose other threads run engine steps, so under load
those waits added up to tens of milliseconds per event. 1 ms bounds each wait lower, at the cost
of more frequent switches between busy threads.

Open files: a gateway holds a socket per model call in flight, daphne one per WebSocket or SSE
stream, and most shells and systemd services start a process with a soft limit of 1,024 (the hard
limit is usually far higher). Past it ``accept()`` and ``connect()`` fail with EMFILE: daphne stops
taking connections, a gateway's calls fail. Every long-running process raises its soft limit to the
hard one at start.
"""

import gc
import logging
import os
import sys

log = logging.getLogger(__name__)

GEN0_THRESHOLD = 50_000
SWITCH_INTERVAL_SECONDS = 0.001


def tune_gc() -> None:
    """Call once the process has imported and set up everything it keeps for its lifetime: the
    collector (above), the GIL's switch interval ($AGENTOPS_SWITCH_INTERVAL_MS, default 1) and
    the open files' soft limit (``open_files_raise``)."""
    open_files_raise()
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GEN0_THRESHOLD, gc.get_threshold()[0]), gen1, gen2)
    milliseconds = os.environ.get("AGENTOPS_SWITCH_INTERVAL_MS", "")
    sys.setswitchinterval(float(milliseconds) / 1000 if milliseconds else SWITCH_INTERVAL_SECONDS)


NR_OPEN_DEFAULT = 1_048_576  # Linux's fs.nr_open: the most a process may set when its hard limit is unlimited


def open_files_raise() -> int:
    """Raise this process's soft limit of open files to its hard limit; returns the soft limit
    now in force (-1 where there is no such limit: not POSIX)."""
    try:
        import resource
    except ImportError:
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NR_OPEN_DEFAULT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:  # macOS caps it lower (kern.maxfilesperproc)
            log.warning("open files: could not raise the soft limit %d to %d: %s", soft, target, exc)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return int(soft)
