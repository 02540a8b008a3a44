"""The gateway's database threads take a new turn's first tick before the work queued for the
turns already driven (``sessions_app/engine/dbpool.py``)."""

import threading
from functools import partial

import pytest

from sessions_app.engine.dbpool import DbPool


def test_work_submitted_first_runs_before_the_work_queued_ahead_of_it() -> None:
    pool = DbPool(1)
    release, started = threading.Event(), threading.Event()
    ran: list[str] = []

    def block() -> None:
        started.set()
        release.wait(10)

    try:
        busy = pool.submit(block)
        assert started.wait(10)  # the one thread is taken; what follows queues
        later = [pool.submit(partial(ran.append, f"reply {n}")) for n in range(3)]
        first = [pool.submit(partial(ran.append, f"new turn {n}"), first=True) for n in range(2)]
        release.set()
        for future in [busy, *later, *first]:
            future.result(10)
    finally:
        pool.shutdown(wait=True)
    assert ran == ["new turn 0", "new turn 1", "reply 0", "reply 1", "reply 2"]


def test_an_exception_reaches_the_caller_and_the_thread_goes_on() -> None:
    pool = DbPool(1)
    try:
        failed = pool.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(10)
        assert pool.submit(lambda: 42).result(10) == 42
    finally:
        pool.shutdown(wait=True)


def test_shutdown_cancels_what_waits_and_refuses_more() -> None:
    pool = DbPool(1)
    release, started = threading.Event(), threading.Event()
    def block() -> None:
        started.set()
        release.wait(10)

    busy = pool.submit(block)
    assert started.wait(10)
    waiting = pool.submit(lambda: None)
    pool.shutdown(cancel_futures=True)
    release.set()
    busy.result(10)
    assert waiting.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
