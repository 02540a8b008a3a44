"""The API load generator of the load proof, run as a process of its own.

``python -m proof._apiload <base_url> <operator_token> <reviewer_token> <agent> <rate> <seconds>``
sends requests open-loop (request i leaves at start + i / rate, whether or not earlier ones are
done, so a slow server shows as latency, not as a lower rate): 60 % reads (session list, one
session, its events, the pending approvals), 20 % creates (a session whose turn asks for an
approval), 20 % decisions (approve a pending request, each once). Prints one JSON report, with
the rate at which the requests really left (a sender short of CPU shows there).
"""

import asyncio
import json
import sys
import time
import uuid
from collections import Counter
from typing import Any

import aiohttp


async def main() -> None:
    base, operator, reviewer, agent = sys.argv[1:5]
    rate, seconds = float(sys.argv[5]), float(sys.argv[6])
    timeout = aiohttp.ClientTimeout(total=30)
    op = aiohttp.ClientSession(base, headers={"Authorization": f"Bearer {operator}"}, timeout=timeout,
                               connector=aiohttp.TCPConnector(limit=200))
    rv = aiohttp.ClientSession(base, headers={"Authorization": f"Bearer {reviewer}"}, timeout=timeout,
                               connector=aiohttp.TCPConnector(limit=200))
    departures: list[float] = []
    sessions: list[str] = []
    pending: list[dict[str, Any]] = []
    taken: set[str] = set()
    latencies: dict[str, list[float]] = {}
    statuses: Counter[str] = Counter()
    errors: Counter[str] = Counter()

    async def timed(kind: str, session: aiohttp.ClientSession, method: str, path: str,
                    **kwargs: Any) -> tuple[int, Any] | None:
        """(status, JSON body or None) of one request, its latency recorded; None on a transport error."""
        start = time.perf_counter()
        departures.append(start)
        try:
            async with session.request(method, path, **kwargs) as response:
                status = response.status
                body = await response.json() if status < 300 else await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            errors[f"{kind}: {type(exc).__name__}"] += 1
            return None
        latencies.setdefault(kind, []).append((time.perf_counter() - start) * 1000)
        statuses[f"{kind} {status}"] += 1
        if status >= 300:
            errors[f"{kind}: HTTP {status}"] += 1
        return status, body

    async def create() -> None:
        script = f"load {uuid.uuid4().hex}\ntool run_command {json.dumps({'command': 'true'})}\nsay done"
        response = await timed("create", op, "POST", "/api/sessions", json={"agent": agent, "input": script},
                               headers={"Idempotency-Key": uuid.uuid4().hex})
        if response is not None and response[0] == 201:
            sessions.append(response[1]["id"])

    async def refresh_pending() -> None:
        response = await timed("read approvals", rv, "GET", "/api/approvals",
                               params={"status": "pending", "limit": "100"})
        if response is not None and response[0] == 200:
            pending[:] = [a for a in response[1]["items"] if a["request_id"] not in taken]

    async def decide() -> None:
        while pending and pending[-1]["request_id"] in taken:
            pending.pop()
        if not pending:
            await refresh_pending()
            return
        approval = pending.pop()
        taken.add(approval["request_id"])
        await timed("decide", rv, "POST", f"/api/approvals/{approval['request_id']}/decision",
                    json={"decision": "approve", "arguments_sha256": approval["arguments_sha256"]})

    async def read(n: int) -> None:
        if not sessions or n % 4 == 0:
            await timed("read list", op, "GET", "/api/sessions", params={"limit": "25"})
        elif n % 4 == 1:
            await timed("read session", op, "GET", f"/api/sessions/{sessions[n % len(sessions)]}")
        elif n % 4 == 2:
            await timed("read events", op, "GET", f"/api/sessions/{sessions[n % len(sessions)]}/events")
        else:
            await refresh_pending()

    tasks = []
    start = time.perf_counter()
    total = int(rate * seconds)
    for n in range(total):
        delay = start + n / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        slot = n % 10
        job = create() if slot < 2 else decide() if slot < 4 else read(n)
        tasks.append(asyncio.create_task(job))
    sent_for = time.perf_counter() - start
    await asyncio.gather(*tasks)
    await op.close()
    await rv.close()
    # The rate the requests really left at: all of them, from the schedule's start until the last
    # one left plus its slot (exactly the rate when each leaves on time, lower by every lag).
    departed = len(departures) / (max(departures) - start + 1 / rate) if departures else 0.0
    print(json.dumps({"sent": total, "sent_for_s": sent_for, "departed_per_s": departed, "latencies_ms": latencies,
                      "statuses": statuses, "errors": errors}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
