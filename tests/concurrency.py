"""Calls started at the same moment from several threads, each on its own database connection."""

import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection


def run_together(calls: Sequence[Callable[[], Any]], timeout: float = 60) -> list[Any]:
    """Run every call in its own thread, all released by one barrier. Returns, in the order of
    ``calls``, what each returned or the exception it raised."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[i] = call()
        except BaseException as exc:
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return results
