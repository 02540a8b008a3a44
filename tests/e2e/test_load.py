"""Many API clients at once against a real daphne, worker and gateway on PostgreSQL: nothing 5xx,
and the product's connections stay under the pools' cap whatever the load."""

import threading
import time
import uuid
from collections import Counter

import httpx
import psycopg
import pytest
from django.db import connection

from agentops.services import api_token_create
from tests.e2e.conftest import STACK_APP_NAME, STACK_POOL_SIZE, Stack, World

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

CLIENTS = 50
SECONDS = 20.0
# daphne, the Celery worker (its beat shares the process) and the gateway, each a pool of its own.
PROCESSES_WITH_POOLS = 3


def _stack_connections() -> int:
    s = connection.settings_dict
    with psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"],
                         dbname="postgres", autocommit=True) as conn:
        # This test database only: other runs on the machine start stacks with the same name.
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND datname = %s",
                           [STACK_APP_NAME, s["NAME"]]).fetchone()
    return int(row[0]) if row else 0


def test_load_50_api_clients_create_and_poll_for_20_s_no_5xx_and_bounded_connections(
        stack: Stack, world: World) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("connection caps are PostgreSQL's (SQLite has no server connections)")
    token = api_token_create(username=world.operator.username)[1]
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    completed = Counter[str]()
    lock = threading.Lock()
    deadline = time.monotonic() + SECONDS

    def client(n: int) -> None:
        with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            while time.monotonic() < deadline:
                try:
                    created = http.post("/api/sessions", json={"agent": world.agent.slug,
                                                               "input": f"sleep 300\nsay {uuid.uuid4().hex} {n}"})
                    with lock:
                        statuses[created.status_code] += 1
                    if created.status_code != 201:
                        continue
                    session_id = created.json()["id"]
                    while time.monotonic() < deadline:
                        polled = http.get(f"/api/sessions/{session_id}")
                        with lock:
                            statuses[polled.status_code] += 1
                        if polled.status_code == 200 and polled.json()["status"] == "idle":
                            with lock:
                                completed["sessions"] += 1
                            break
                        time.sleep(0.2)
                except httpx.HTTPError as exc:
                    with lock:
                        failures.append(f"{type(exc).__name__}: {exc}")

    peak = 0
    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        peak = max(peak, _stack_connections())
        time.sleep(0.25)
    cap = PROCESSES_WITH_POOLS * STACK_POOL_SIZE
    print(f"{sum(statuses.values())} requests {dict(statuses)}, {completed['sessions']} sessions completed, "
          f"peak {peak} connections (cap {cap})")
    assert failures == []
    assert not [status for status in statuses if status >= 500], dict(statuses)
    assert statuses[201] >= CLIENTS and completed["sessions"] >= CLIENTS
    assert 0 < peak <= cap
