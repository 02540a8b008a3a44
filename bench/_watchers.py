"""WebSocket watchers for the load benchmark, run as their own process.

``python bench/_watchers.py <base_url> <username> <password> <per_session> <seconds>`` reads session
ids from stdin (one per line, as the benchmark creates them) and opens ``per_session`` WebSockets
to each, until stdin closes (then it drains for 3 s) or ``seconds`` have passed, as the
dashboard does: ``hello`` with the last seq it has, then live events, asking for
any gap (``resend``) like ``live.js``. At the end it prints one JSON line: push latency (event
created → received, for live events only), deliveries, what the channel layer dropped (gaps that
had to be re-read) and what was still missing after replay.
"""

import asyncio
import json
import sys
import time
from datetime import datetime
from typing import Any

import aiohttp

DRAIN_SECONDS = 3.0


class Deadline:
    """When every watcher stops: at most ``seconds`` from the start, sooner once stdin closes."""

    def __init__(self, seconds: float) -> None:
        self.at = time.time() + seconds

    def left(self) -> float:
        return self.at - time.time()


class Watcher:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.seqs: set[int] = set()
        self.last = 0
        self.latencies: list[float] = []
        self.received_at: list[float] = []  # when each of ``latencies`` arrived (Unix time)
        # created → committed → picked by the announcer → listeners checked → rendered → sent →
        # taken by the web process's consumer → received, ms (the server's AGENTOPS_PUSH_TIMINGS),
        # then when it was received (Unix time) and the event's type
        self.stages: list[list[Any]] = []
        self.gaps = 0
        self.reconnects = 0
        self.errors: list[str] = []
        self.pending_resend: dict[str, Any] | None = None
        self.created_at = time.time()  # when the benchmark handed the session over
        self.connected_at = 0.0
        self.first_message_at = 0.0

    async def run(self, http: aiohttp.ClientSession, base: str, deadline: Deadline) -> None:
        """Watch until the deadline; a dropped connection is opened again from the last seq seen,
        as live.js does (what was missed meanwhile comes as the backlog)."""
        backoff = 0.2
        while deadline.left() > 0:
            try:
                await self._connection(http, base, deadline)
                backoff = 0.2
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.reconnects += 1
                await asyncio.sleep(min(backoff, max(0.0, deadline.left())))
                backoff = min(backoff * 2, 3.0)

    async def _connection(self, http: aiohttp.ClientSession, base: str, deadline: Deadline) -> None:
        ws_url = base.replace("http://", "ws://") + f"/ws/sessions/{self.session_id}/"
        async with http.ws_connect(ws_url, origin=base, timeout=aiohttp.ClientWSTimeout(ws_close=2)) as ws:
            closer = asyncio.create_task(_close_at(ws, deadline))
            self.connected_at = self.connected_at or time.time()
            try:
                await ws.send_json({"type": "hello", "last_seq": self.last})
                live_after = time.time()
                async for message in ws:
                    if message.type != aiohttp.WSMsgType.TEXT:
                        break
                    self.first_message_at = self.first_message_at or time.time()
                    self._receive(ws, json.loads(message.data), live_after)
                    if self.pending_resend is not None:
                        await ws.send_json(self.pending_resend)
                        self.pending_resend = None
            finally:
                closer.cancel()
            if deadline.left() > 0:
                raise ConnectionError(f"the server closed the WebSocket ({ws.close_code})")

    def _receive(self, ws: Any, data: dict[str, Any], live_after: float) -> None:
        received = time.time()
        event = data.get("event") or {}
        seq = int(event.get("seq", 0))
        if seq in self.seqs:
            return
        if seq > self.last + 1:  # the channel layer dropped some: ask for them, as live.js does
            self.gaps += 1
            self.pending_resend = {"type": "resend", "after": self.last, "until": seq - 1}
        self.seqs.add(seq)
        self.last = max(self.last, seq)
        created = datetime.fromisoformat(str(event["created_at"])).timestamp()
        if created > live_after:  # a live event, not the backlog
            self.latencies.append((received - created) * 1000)
            self.received_at.append(received)
            stages, announced = data.get("stages"), data.get("announced_at")
            if stages and len(stages) == 4 and announced:
                marks = [created, *stages, announced, data.get("forwarded_at") or announced, received]
                self.stages.append([*((b - a) * 1000 for a, b in zip(marks, marks[1:], strict=False)), received,
                                    str(event.get("type", ""))])


async def _close_at(ws: Any, deadline: Deadline) -> None:
    while deadline.left() > 0:
        await asyncio.sleep(min(0.5, max(0.01, deadline.left())))
    await ws.close()


async def main() -> None:
    base, username, password, per_session, seconds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), \
        float(sys.argv[5])
    deadline = Deadline(seconds)
    started = time.time()
    jar = aiohttp.CookieJar(unsafe=True)
    watchers: list[Watcher] = []
    tasks: list[asyncio.Task[None]] = []
    # No cap on connections: aiohttp's default of 100 held the other watchers back until the end.
    async with aiohttp.ClientSession(cookie_jar=jar, timeout=aiohttp.ClientTimeout(total=None),
                                     connector=aiohttp.TCPConnector(limit=0)) as http:
        async with http.get(f"{base}/login/") as page:
            await page.text()
        token = next((c.value for c in jar if c.key == "csrftoken"), "")
        async with http.post(f"{base}/login/", data={"username": username, "password": password,
                                                      "csrfmiddlewaretoken": token},
                             headers={"Referer": f"{base}/login/"}, allow_redirects=False) as response:
            if response.status not in (302, 303):
                raise SystemExit(f"login failed: {response.status}")
        print("ready", flush=True)
        reader = asyncio.StreamReader()
        await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while deadline.left() > 0:
            try:
                line = await asyncio.wait_for(reader.readline(), timeout=max(0.1, deadline.left()))
            except TimeoutError:
                break
            if not line:  # the benchmark is done: drain, then stop
                deadline.at = min(deadline.at, time.time() + DRAIN_SECONDS)
                break
            session_id = line.decode().strip()
            for _ in range(per_session):
                watcher = Watcher(session_id)
                watchers.append(watcher)
                tasks.append(asyncio.create_task(watcher.run(http, base, deadline)))
        await asyncio.gather(*tasks)
    report: dict[str, Any] = {
        "clients": len(watchers), "latencies_ms": [x for w in watchers for x in w.latencies],
        "received_at": [x for w in watchers for x in w.received_at],
        "stages_ms": [x for w in watchers for x in w.stages],
        "received": {w.session_id: sorted(w.seqs) for w in watchers[::per_session]},
        "per_client": [[w.session_id, len(w.seqs), w.last] for w in watchers],
        # Handed over → WebSocket open, → its first message (the backlog), ms: a watcher that opens
        # late gets the events of its first seconds from the backlog, which no latency above counts.
        "opening_ms": [[(w.connected_at - w.created_at) * 1000, (w.first_message_at - w.created_at) * 1000]
                       for w in watchers if w.connected_at and w.first_message_at],
        "silent": [[w.session_id[:8], round(w.connected_at - started, 1) if w.connected_at else None]
                   for w in watchers if not w.first_message_at][:10],
        "gaps": sum(w.gaps for w in watchers), "reconnects": sum(w.reconnects for w in watchers),
        "errors": sorted({e for w in watchers for e in w.errors})[:5]}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
