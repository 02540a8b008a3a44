"""Polling for tests that watch real processes (workers, daphne, the browser)."""

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition",
             interval: float = 0.05) -> Any:
    """Return the first truthy value of ``predicate()``; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
