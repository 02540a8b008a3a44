"""WebSocket (and SSE) clients of the proofs, run as a process of their own.

``python -m proof._watch <base_url> <username> <password> <ws_per_session> <sse_per_session>``
reads session ids from stdin, one per line, and subscribes that many clients to each, as the
dashboard does (``live.js``): ``hello`` with the last seq it has, then live events; a gap in seq
makes it ask for the missing range (``resend``), a dropped connection makes it connect again from
its last seq. The line ``replay`` makes every client ask once more for everything after its last
seq (what a client does when it comes back: the tail of a session has no later event to reveal a
gap); ``expect <session id> <seq>`` says the session's last seq (the proof read it from the
database once the work ended); ``stop`` (or the end of stdin) ends it, once every client of an
expected session has that seq (a replay answered by a busy server takes seconds) or after 45 s.
It prints one JSON report: per client what it received (each seq counted), push latency (event
created → received, live events only).
"""

import asyncio
import json
import sys
import time
from datetime import datetime
from typing import Any

import aiohttp


class Client:
    def __init__(self, session_id: str, kind: str) -> None:
        self.session_id, self.kind = session_id, kind
        self.counts: dict[int, int] = {}  # seq → times received (the client keeps the first)
        self.last = 0
        self.latencies: list[float] = []
        self.split: list[tuple[float, float]] = []  # (created → announced, announced → received) ms
        # created → committed → picked by the announcer → listeners checked → rendered → sent → received, ms
        self.stages: list[list[float]] = []
        self.tail_marks: list[tuple[float, str]] = []  # (received at, event type) of each row of stages
        self.gaps = 0
        self.reconnects = 0
        self.errors: list[str] = []
        self.ws: Any = None
        self.stopped = False
        self.last_message_at = time.time()
        self.response: Any = None
        self.replay_asked_at = 0.0
        self.by_replay = 0  # events this client first got from the replay: it had missed them live

    @property
    def seqs(self) -> set[int]:
        return set(self.counts)

    def receive(self, event: dict[str, Any], live_after: float, announced_at: float | None = None,
                stages: list[float] | None = None) -> dict[str, Any] | None:
        """Take one event; returns a resend request when it shows a gap."""
        received = self.last_message_at = time.time()
        seq = int(event.get("seq", 0))
        self.counts[seq] = self.counts.get(seq, 0) + 1
        if self.counts[seq] > 1:
            return None
        if self.replay_asked_at and received >= self.replay_asked_at:
            self.by_replay += 1
        ask = None
        if seq > self.last + 1:
            self.gaps += 1
            ask = {"type": "resend", "after": self.last, "until": seq - 1}
        self.last = max(self.last, seq)
        created = datetime.fromisoformat(str(event["created_at"])).timestamp()
        if created > live_after:
            self.latencies.append((received - created) * 1000)
            if announced_at is not None:  # the sender's share, and the server's and client's
                self.split.append(((announced_at - created) * 1000, (received - announced_at) * 1000))
                if stages and len(stages) == 4:  # the server's AGENTOPS_PUSH_TIMINGS
                    marks = [created, *stages, announced_at, received]
                    self.stages.append([(b - a) * 1000 for a, b in zip(marks, marks[1:], strict=False)])
                    self.tail_marks.append((received, str(event.get("type", ""))))
        return ask

    async def run_ws(self, http: aiohttp.ClientSession, base: str) -> None:
        backoff = 0.2
        while not self.stopped:
            try:
                url = base.replace("http://", "ws://") + f"/ws/sessions/{self.session_id}/"
                async with http.ws_connect(url, origin=base, heartbeat=10) as ws:
                    self.ws = ws
                    await ws.send_json({"type": "hello", "last_seq": self.last})
                    live_after = time.time()
                    backoff = 0.2
                    async for message in ws:
                        if message.type != aiohttp.WSMsgType.TEXT:
                            break
                        data = json.loads(message.data)
                        if data.get("type") == "event":
                            ask = self.receive(data["event"], live_after, data.get("announced_at"), data.get("stages"))
                            if ask is not None:
                                await ws.send_json(ask)
                    self.ws = None
                if not self.stopped:
                    raise ConnectionError("closed by the server")
            except Exception as exc:
                self.ws = None
                if self.stopped:
                    return
                self.errors.append(type(exc).__name__)
                self.reconnects += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def run_sse(self, http: aiohttp.ClientSession, base: str) -> None:
        backoff = 0.2
        while not self.stopped:
            try:
                url = f"{base}/api/sessions/{self.session_id}/events/stream?after={self.last}"
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as response:
                    self.response = response
                    if response.status != 200:
                        raise ConnectionError(f"HTTP {response.status}")
                    live_after = time.time()
                    backoff = 0.2
                    data = ""
                    async for raw in response.content:
                        line = raw.decode().rstrip("\n")
                        if line.startswith("data:"):
                            data += line[5:].strip()
                        elif not line and data:
                            payload = json.loads(data)
                            self.receive(payload.get("event", payload), live_after)
                            data = ""
                        if self.stopped:
                            return
                if not self.stopped:
                    raise ConnectionError("stream ended")
            except Exception as exc:
                if self.stopped:
                    return
                self.errors.append(type(exc).__name__)
                self.reconnects += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def replay(self) -> None:
        """Ask for everything after the last seq: the WebSocket by ``resend``; an SSE client by
        connecting again from its last id (what EventSource does when its stream breaks)."""
        self.replay_asked_at = time.time()
        if self.kind == "ws" and self.ws is not None and not self.ws.closed:
            await self.ws.send_json({"type": "resend", "after": self.last, "until": self.last + 5000})
        elif self.kind == "sse" and self.response is not None:
            self.response.close()


async def login(http: aiohttp.ClientSession, base: str, username: str, password: str) -> None:
    async with http.get(f"{base}/login/") as page:
        await page.text()
    token = next((c.value for c in http.cookie_jar if c.key == "csrftoken"), "")
    async with http.post(f"{base}/login/", data={"username": username, "password": password,
                                                 "csrfmiddlewaretoken": token},
                         headers={"Referer": f"{base}/login/"}, allow_redirects=False) as response:
        if response.status not in (302, 303):
            raise SystemExit(f"login failed: HTTP {response.status}")


async def main() -> None:
    base, username, password = sys.argv[1], sys.argv[2], sys.argv[3]
    ws_each, sse_each = int(sys.argv[4]), int(sys.argv[5])
    clients: list[Client] = []
    tasks: list[asyncio.Task[None]] = []
    expected: dict[str, int] = {}  # session id → its last seq, once the proof knows it
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True),
                                     timeout=aiohttp.ClientTimeout(total=None),
                                     connector=aiohttp.TCPConnector(limit=0)) as http:
        await login(http, base, username, password)
        print("ready", flush=True)
        reader = asyncio.StreamReader()
        await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while True:
            line = (await reader.readline()).decode().strip()
            if not line or line == "stop":
                # Drain: what is on its way (a replay, a backlog behind) arrives before the report.
                deadline = time.time() + 45  # the proofs wait 60 s for the report
                while time.time() < deadline and (
                        any(time.time() - c.last_message_at < 2 for c in clients)
                        or any(c.last < expected.get(c.session_id, 0) for c in clients)):
                    await asyncio.sleep(0.5)
                break
            if line.startswith("expect "):
                _, session_id, seq = line.split()
                expected[session_id] = int(seq)
                continue
            if line == "replay":
                await asyncio.gather(*(c.replay() for c in clients))
                continue
            for n in range(ws_each + sse_each):
                client = Client(line, "ws" if n < ws_each else "sse")
                clients.append(client)
                runner = client.run_ws if client.kind == "ws" else client.run_sse
                tasks.append(asyncio.create_task(runner(http, base)))
        for client in clients:
            client.stopped = True
            if client.ws is not None:
                await client.ws.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    report = {"clients": [{"session": c.session_id, "kind": c.kind, "seqs": sorted(c.seqs),
                           "duplicates": sum(n - 1 for n in c.counts.values()), "gaps": c.gaps,
                           "by_replay": c.by_replay,
                           "reconnects": c.reconnects, "errors": sorted(set(c.errors))[:3]} for c in clients],
              "latencies_ms": [x for c in clients for x in c.latencies],
              "split_ms": [x for c in clients for x in c.split],
              "stages_ms": [x for c in clients for x in c.stages],
              "tail_marks": [x for c in clients for x in c.tail_marks]}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
