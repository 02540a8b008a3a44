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
"""

import gc
import os
import sys

GEN0_THRESHOLD = 50_000
SWITCH_INTERVAL_SECONDS = 0.001


def tune_gc() -> None:
    """Call once the process has imported and set up everything it keeps for its lifetime: the
    collector (above) and the GIL's switch interval ($AGENTOPS_SWITCH_INTERVAL_MS, default 1)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GEN0_THRESHOLD, gc.get_threshold()[0]), gen1, gen2)
    milliseconds = os.environ.get("AGENTOPS_SWITCH_INTERVAL_MS", "")
    sys.setswitchinterval(float(milliseconds) / 1000 if milliseconds else SWITCH_INTERVAL_SECONDS)
