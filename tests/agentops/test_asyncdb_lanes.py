"""The worker threads of the async code's database reads (``agentops.asyncdb.Lanes``): the reads of
open connections go first, and a new connection's checks never hold more than their share."""

import asyncio
import threading
import time
from typing import Any

import pytest

from agentops.asyncdb import Lanes

WAIT = 5.0


def test_a_free_thread_takes_the_first_lane_before_older_work_of_the_second() -> None:
    lanes = Lanes(1, 1, "test-lanes")
    release = threading.Event()
    order: list[str] = []
    blocker = lanes.submit(1, lambda: release.wait(WAIT))
    later = [lanes.submit(1, lambda: order.append("admit-1")), lanes.submit(1, lambda: order.append("admit-2")),
             lanes.submit(0, lambda: order.append("serve-1")), lanes.submit(0, lambda: order.append("serve-2"))]
    release.set()
    for future in [blocker, *later]:
        future.result(timeout=WAIT)
    assert order == ["serve-1", "serve-2", "admit-1", "admit-2"]  # each lane in arrival order


def test_the_second_lane_runs_on_at_most_its_share_of_the_threads() -> None:
    lanes = Lanes(3, 1, "test-lanes")
    release = threading.Event()
    running, peak, lock = [0], [0], threading.Lock()

    def admit() -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        release.wait(WAIT)
        with lock:
            running[0] -= 1

    admitting = [lanes.submit(1, admit) for _ in range(4)]
    # Two threads stay free for the first lane while the second's work waits.
    served = [lanes.submit(0, lambda: "served") for _ in range(2)]
    assert [f.result(timeout=WAIT) for f in served] == ["served", "served"]
    assert not any(f.done() for f in admitting)
    release.set()
    for future in admitting:
        future.result(timeout=WAIT)
    assert peak[0] == 1


def test_threads_start_as_work_comes_and_never_exceed_the_size() -> None:
    lanes = Lanes(2, 2, "test-lanes-size")
    names: set[str] = set()

    def note() -> None:
        names.add(threading.current_thread().name)
        time.sleep(0.01)

    futures = [lanes.submit(0, note) for _ in range(10)]
    for future in futures:
        future.result(timeout=WAIT)
    assert names and len(names) <= 2 and all(n.startswith("test-lanes-size-") for n in names)


def test_an_error_reaches_the_caller_and_the_thread_goes_on() -> None:
    lanes = Lanes(1, 1, "test-lanes")

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        lanes.submit(0, fail).result(timeout=WAIT)
    assert lanes.submit(1, lambda: 42).result(timeout=WAIT) == 42


def test_a_lane_is_an_executor_for_the_event_loop() -> None:
    lanes = Lanes(2, 1, "test-lanes")

    async def both() -> list[int]:
        loop = asyncio.get_running_loop()
        return list(await asyncio.gather(loop.run_in_executor(lanes.lane(0), sum, [1, 2]),
                                         loop.run_in_executor(lanes.lane(1), max, [3, 4])))

    assert asyncio.run(both()) == [3, 4]


def test_a_live_event_for_a_client_that_left_is_not_an_error() -> None:
    """Daphne raises autobahn's Disconnected when a consumer sends on a socket the browser has just
    closed (a reload while an event was on its way): dropped quietly, daphne's disconnect follows.
    Any other failure of a handler still goes up."""
    from autobahn.exception import Disconnected

    from agentops.asyncdb import JsonConsumer

    class Left(JsonConsumer):
        async def event_message(self, message: dict[str, Any]) -> None:
            raise Disconnected("Attempt to send on a closed protocol")

        async def broken_message(self, message: dict[str, Any]) -> None:
            raise RuntimeError("a bug")

    consumer = Left()
    consumer.scope = {"type": "websocket", "path": "/ws/sessions/x/"}
    asyncio.run(consumer.dispatch({"type": "event.message"}))
    with pytest.raises(RuntimeError):
        asyncio.run(consumer.dispatch({"type": "broken.message"}))
