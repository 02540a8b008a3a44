"""A daphne process that outlives a Redis restart keeps its WebSocket and SSE clients live.

Redis keeps the channel layer's group memberships; a restart (no persistence) forgets them, while
the consumers of a daphne process that stayed up are still connected. Real daphne, a real private
redis-server restarted on its port, the product's announcer in this process."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from django.contrib.auth.models import User
from django.db import connection

from agentops.embedded_redis import free_port, redis_binary
from agentops.run import wait_port
from sessions_app import services
from sessions_app.models import AgentSession, Event
from tests import factories
from tests.helpers import ROOT, database_url, login
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


class PrivateRedis:
    """redis-server on a port of its own, without persistence: a restart forgets everything."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="agentops-restart-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--loglevel", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proc, "redis-server")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.kill()


WEB_APP_NAME = "agentops-restart-web"  # the daphne's connections, in pg_stat_activity


@pytest.fixture
def web(redis: PrivateRedis, settings: Any, tmp_path: Any) -> Iterator[str]:
    """One daphne process on the private Redis; this process announces on it too."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [redis.url], "expiry": 60}}}
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": redis.url, "CELERY_BROKER_URL": redis.url,
           "AGENTOPS_LAYER_CHECK_SECONDS": "0.5", "PYTHONUNBUFFERED": "1", "DATABASE_APPLICATION_NAME": WEB_APP_NAME}
    log = (tmp_path / "daphne.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                             "agentops.asgi:application"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_port(port, proc, "daphne")
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        print((tmp_path / "daphne.log").read_text(errors="replace")[-12000:])


class Watcher:
    """WebSocket and SSE clients of one session in a thread of their own: they collect seqs."""

    def __init__(self, base: str, cookie: str, session_id: str) -> None:
        self.base, self.cookie, self.session_id = base, cookie, session_id
        self.ws_seqs: list[int] = []
        self.sse_seqs: list[int] = []
        self.closes: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.ws: Any = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.futures = [asyncio.run_coroutine_threadsafe(self._ws(), self.loop),
                        asyncio.run_coroutine_threadsafe(self._sse(), self.loop)]

    async def _ws(self) -> None:
        async with aiohttp.ClientSession(cookies={"sessionid": self.cookie}) as http:
            url = self.base.replace("http://", "ws://") + f"/ws/sessions/{self.session_id}/"
            async with http.ws_connect(url, origin=self.base) as ws:
                self.ws = ws
                await ws.send_json({"type": "hello", "last_seq": 0})
                async for message in ws:
                    if message.type != aiohttp.WSMsgType.TEXT:
                        break
                    data = json.loads(message.data)
                    if data.get("type") == "event":
                        self.ws_seqs.append(int(data["event"]["seq"]))
                self.closes.append(f"ws closed {ws.close_code}")

    async def _sse(self) -> None:
        async with aiohttp.ClientSession(cookies={"sessionid": self.cookie}) as http:
            url = f"{self.base}/api/sessions/{self.session_id}/events/stream?after=0"
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=None)) as response:
                assert response.status == 200, response.status
                async for raw in response.content:
                    line = raw.decode().strip()
                    if line.startswith("id:"):
                        self.sse_seqs.append(int(line[3:]))
                self.closes.append("sse ended")

    def resend(self, after: int, until: int) -> None:
        asyncio.run_coroutine_threadsafe(self.ws.send_json({"type": "resend", "after": after, "until": until}),
                                         self.loop).result(5)

    def stop(self) -> None:
        async def end() -> None:
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(end(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def record(session: AgentSession, text: str) -> int:
    return services.event_record(session_id=session.id, type="note.added", payload={"text": text}).seq


def _cut_database_connections() -> None:
    """pg_terminate_backend every connection of the web process (the chaos proof cuts them all
    right after a Redis restart): its pooled connections die under its reads. Only the web's: this
    process's own pool (the test's, the announcer's) must outlive the test for the tests after it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND application_name = %s", [WEB_APP_NAME])
        (cut,) = cursor.fetchone()
    assert cut >= 1, "the web process held no connection to cut"


@pytest.mark.parametrize("cut_database", [False, True], ids=["redis", "redis-and-database"])
def test_clients_of_a_daphne_that_outlives_a_redis_restart_get_every_later_event(
        redis: PrivateRedis, web: str, cut_database: bool) -> None:
    owner: User = factories.user(groups=["operators"])
    session = factories.session(owner=owner, title="restart")
    first = record(session, "before")
    watcher = Watcher(web, login(owner).cookies["sessionid"].value, str(session.id))
    try:
        wait_for(lambda: first in watcher.ws_seqs and first in watcher.sse_seqs, timeout=20,
                 what="the clients' backlog")
        second = record(session, "live before the restart")
        wait_for(lambda: second in watcher.ws_seqs and second in watcher.sse_seqs, timeout=10,
                 what="a live event before the restart")

        redis.kill()
        redis.start()  # same port, empty: the group memberships are gone
        if cut_database:
            if connection.vendor != "postgresql":
                pytest.skip("pg_terminate_backend is PostgreSQL's")
            time.sleep(0.6)  # while the web process re-reads after rejoining
            _cut_database_connections()
        time.sleep(0.3)
        during = record(session, "committed while nobody was in the group")
        time.sleep(2.0)  # the web process notices the loss within AGENTOPS_LAYER_CHECK_SECONDS
        after = [record(session, f"after the restart {n}") for n in range(3)]
        # The last events have no later one to reveal a gap: they must arrive live.
        expected = list(Event.objects.filter(session=session).order_by("seq").values_list("seq", flat=True))
        assert {first, second, during, *after} <= set(expected)
        try:
            wait_for(lambda: sorted(set(watcher.ws_seqs)) == expected and sorted(set(watcher.sse_seqs)) == expected,
                     timeout=15, what="every event live after the restart")
        except AssertionError:
            print("expected", expected, "ws", watcher.ws_seqs, "sse", watcher.sse_seqs, "closes", watcher.closes)
            raise
        assert watcher.ws_seqs == expected and watcher.sse_seqs == expected  # each once, in order
        assert watcher.closes == []  # they stayed connected: nothing to reconnect

        watcher.resend(0, after[-1])  # and a resend still answers
        wait_for(lambda: len(watcher.ws_seqs) == 2 * len(expected), timeout=10, what="the resend's answer")
        assert watcher.ws_seqs[len(expected):] == expected
    finally:
        watcher.stop()
