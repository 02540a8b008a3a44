"""Process tuning shared by the long-running processes (daphne, Celery workers, model gateways).

Full garbage-collection passes over a Django process's start-up objects cost tens of
milliseconds (measured here: 46-62 ms, the tail of every live push). ``gc.freeze()`` after
start-up moves those objects out of the collector's view, and a larger first-generation threshold
makes collections rarer; the processes are long-lived and allocate in bursts.
"""

import gc

GEN0_THRESHOLD = 50_000


def tune_gc() -> None:
    """Call once the process has imported and set up everything it keeps for its lifetime."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GEN0_THRESHOLD, gc.get_threshold()[0]), gen1, gen2)
