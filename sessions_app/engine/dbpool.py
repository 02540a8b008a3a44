"""The model gateway's database threads: a small pool whose queue serves new turns first.

A ``ThreadPoolExecutor`` serves its queue in order. In a burst of new sessions the gateway's queue
held both the new turns' first ticks and the replies of the turns already running, in arrival
order, and the last sessions' first model calls went out seconds after they were created
(bench/concurrency.py N = 1,000: created → turn.started p50 1.3 s, p99 2.5 s). Every session
makes the same calls, so the run ends with the chain of the session that started last; a turn
already running can wait a little (its own first call left earlier), a new one cannot. Work
submitted with ``first=True`` (a new turn's first tick) is taken before the rest; within each
class, in order.
"""

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_STOP = object()


class DbPool:
    """``threads`` threads running submitted callables; ``first`` work ahead of the rest."""

    def __init__(self, threads: int, *, name: str = "gateway-db") -> None:
        self._queue: queue.PriorityQueue[tuple[int, int, Any, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self.size = threads
        self._name = name
        self._threads: list[threading.Thread] = []  # started at the first submit, as an executor's
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[], Any], *, first: bool = False) -> "Future[Any]":
        if self._closed:
            raise RuntimeError("the gateway's database pool is shut down")
        if len(self._threads) < self.size:
            with self._lock:
                while len(self._threads) < self.size:
                    thread = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
                    thread.start()
                    self._threads.append(thread)
        future: Future[Any] = Future()
        self._queue.put((0 if first else 1, next(self._order), future, fn))
        return future

    def _work(self) -> None:
        while True:
            _, _, future, fn = self._queue.get()
            if future is _STOP:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting coroutine, as an executor does
                future.set_exception(exc)
            else:
                future.set_result(result)

    def shutdown(self, *, wait: bool = False, cancel_futures: bool = False) -> None:
        """Stop the threads once the work queued before is done (or cancelled: ``cancel_futures``)."""
        self._closed = True
        if cancel_futures:
            while True:
                try:
                    _, _, future, _ = self._queue.get_nowait()
                except queue.Empty:
                    break
                if future is not _STOP:
                    future.cancel()
        for _ in self._threads:
            self._queue.put((2, next(self._order), _STOP, None))
        if wait:
            for thread in self._threads:
                thread.join()
