"""Open SSE streams do not hold the web process's database connections (found by the chaos proof)."""

import threading
import time

import httpx
import pytest

from agentops.services import api_token_create
from sessions_app.engine.commands import session_start
from tests.e2e.conftest import STACK_POOL_SIZE, Stack, World

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_more_sse_streams_than_the_pool_holds_leave_the_api_answering(stack: Stack, world: World) -> None:
    """Each stream's request used to keep its thread's pooled connection until the stream ended:
    with as many streams open as the pool has connections, every other request of the process
    waited 30 s for one and failed."""
    token = api_token_create(username=world.operator.username)[1]
    session, _ = session_start(agent=world.agent, owner=world.operator, input="say hello")
    headers = {"Authorization": f"Bearer {token}"}
    opened = threading.Semaphore(0)
    stop = threading.Event()

    def listen() -> None:
        with httpx.Client(base_url=stack.url, headers=headers, timeout=60) as http, \
                http.stream("GET", f"/api/sessions/{session.id}/events/stream?max_seconds=40") as response:
            assert response.status_code == 200
            opened.release()
            for _ in response.iter_lines():
                if stop.is_set():
                    return

    streams = [threading.Thread(target=listen, daemon=True) for _ in range(STACK_POOL_SIZE + 2)]
    for thread in streams:
        thread.start()
    try:
        for _ in streams:
            assert opened.acquire(timeout=20), "a stream did not open"
        with httpx.Client(base_url=stack.url, headers=headers, timeout=20) as http:
            started = time.monotonic()
            response = http.get(f"/api/sessions/{session.id}")
            took = time.monotonic() - started
        assert response.status_code == 200
        assert took < 5, f"the API waited {took:.1f} s for a database connection"
    finally:
        stop.set()
