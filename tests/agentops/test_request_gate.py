"""The web process's request gate (agentops.middleware.RequestGateASGI), at the ASGI level: at
most AGENTOPS_WEB_CONCURRENCY requests inside at once, a stream lets go when its headers leave,
a request whose client left while it waited never runs, long-polls take no place."""

import asyncio
from typing import Any

import pytest
from django.test import override_settings

from agentops.middleware import RequestGateASGI


class Client:
    """One HTTP request as the server hands it to the application."""

    def __init__(self, path: str = "/api/sessions", chunks: tuple[bytes, ...] = (b"{}",)) -> None:
        self.scope = {"type": "http", "path": path, "method": "POST", "headers": []}
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for n, chunk in enumerate(chunks):
            self.inbox.put_nowait({"type": "http.request", "body": chunk, "more_body": n < len(chunks) - 1})
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def leave(self) -> None:
        self.inbox.put_nowait({"type": "http.disconnect"})


class App:
    """An application that records who is inside, answers when told, and streams after its start."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.ran: list[str] = []
        self.bodies: dict[str, bytes] = {}
        self.release: dict[str, asyncio.Event] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        name = scope["path"]
        self.ran.append(name)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies[name] = body
        self.inside.append(name)
        await self.release.setdefault(name, asyncio.Event()).wait()
        self.inside.remove(name)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await self.release.setdefault(name + ":end", asyncio.Event()).wait()  # a stream's body, later
        await send({"type": "http.response.body", "body": b"done"})


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@override_settings(AGENTOPS_WEB_CONCURRENCY=1)
def test_one_place_a_stream_lets_go_at_its_headers_and_a_client_that_left_never_runs() -> None:
    async def scenario() -> None:
        app = App()
        gate = RequestGateASGI(app)
        first, second, third = Client("/a"), Client("/b", chunks=(b"par", b"ts")), Client("/c")
        tasks = [asyncio.create_task(gate(c.scope, c.receive, c.send)) for c in (first, second, third)]
        await _settle()
        assert app.inside == ["/a"] and app.ran == ["/a"]  # one place: the others wait outside
        third.leave()  # its client gives up while it waits
        await _settle()
        assert tasks[2].done() and third.sent == []
        app.release["/a"] = app.release.get("/a", asyncio.Event())
        app.release["/a"].set()
        await _settle()
        # /a's headers left (its body streams on): /b is let in, with its whole body.
        assert first.sent[0]["type"] == "http.response.start" and not tasks[0].done()
        assert app.inside == ["/b"] and app.bodies["/b"] == b"parts"
        for name in ("/a:end", "/b", "/b:end"):
            app.release.setdefault(name, asyncio.Event()).set()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert app.ran == ["/a", "/b"]  # /c never ran
        assert second.sent[-1] == {"type": "http.response.body", "body": b"done"}

    asyncio.run(scenario())


@override_settings(AGENTOPS_WEB_CONCURRENCY=1)
def test_a_long_poll_takes_no_place_and_a_failing_request_gives_its_place_back() -> None:
    async def scenario() -> None:
        app = App()
        gate = RequestGateASGI(app)
        poll, busy = Client("/api/runner/jobs/next"), Client("/a")
        tasks = [asyncio.create_task(gate(c.scope, c.receive, c.send)) for c in (poll, busy)]
        await _settle()
        assert sorted(app.inside) == ["/a", "/api/runner/jobs/next"]  # the poll is not counted

        async def failing(scope: dict[str, Any], receive: Any, send: Any) -> None:
            raise RuntimeError("boom")

        broken = RequestGateASGI(failing)
        broken._gate = asyncio.Semaphore(1)
        with pytest.raises(RuntimeError):
            await broken(Client().scope, Client().receive, Client().send)
        assert not broken._gate.locked()  # released although no response ever started
        for name in ("/a", "/a:end", "/api/runner/jobs/next", "/api/runner/jobs/next:end"):
            app.release.setdefault(name, asyncio.Event()).set()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)

    asyncio.run(scenario())
