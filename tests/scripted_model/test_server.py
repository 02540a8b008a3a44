"""The HTTP server: concurrent answers and the API key."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from scripted_model.server import start_in_thread
from tests.scripted_model.chat import ask
from tests.waiting import wait_for


def test_scripted_model_serves_requests_concurrently(client: OpenAI) -> None:
    scripts = [f"sleep 400\nsay answer {n}" for n in range(4)]

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda s: ask(client, [{"role": "user", "content": s}]), scripts))
    elapsed = time.monotonic() - started

    assert [a.choices[0].message.content for a in answers] == [f"answer {n}" for n in range(4)]
    assert elapsed < 1.2  # one sleeping answer must not hold up the others (serial would be 1.6 s)


def test_scripted_model_rejects_wrong_api_key() -> None:
    server, base_url = start_in_thread(api_key="right")
    try:
        with pytest.raises(openai.AuthenticationError) as failure:
            OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
        models = OpenAI(base_url=base_url, api_key="right", max_retries=0).models.list()
    finally:
        server.shutdown()
        server.server_close()

    assert failure.value.status_code == 401
    assert failure.value.code == "invalid_api_key"
    assert [m.id for m in models.data] == ["scripted"]


def test_scripted_model_error_with_retry_after_sends_the_header(base_url: str) -> None:
    body = {"model": "scripted", "messages": [{"role": "user", "content": "error 429 3\nsay ok"}]}
    first = httpx.post(f"{base_url}/chat/completions", json=body, timeout=10)
    assert first.status_code == 429 and first.headers["retry-after"] == "3"
    assert "retry-after-ms" not in first.headers
    again = httpx.post(f"{base_url}/chat/completions", json=body, timeout=10)
    assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"] == "ok"


def test_scripted_model_stats_count_calls_in_flight(base_url: str) -> None:
    import threading

    root = base_url.removesuffix("/v1")
    body = {"model": "scripted", "messages": [{"role": "user", "content": "sleep 800\nsay slow"}]}
    threads = [threading.Thread(target=httpx.post, args=(f"{base_url}/chat/completions",),
                                kwargs={"json": body, "timeout": 10}) for _ in range(3)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while httpx.get(f"{root}/_stats").json()["in_flight"] < 3:
        assert time.monotonic() < deadline, "three calls never in flight together"
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    stats = httpx.get(f"{root}/_stats").json()
    assert stats["in_flight"] == 0 and stats["peak_in_flight"] >= 3


def test_scripted_model_connections_send_without_waiting_for_acks() -> None:
    """Each answer's body is not held back by Nagle's algorithm behind the headers' delayed ACK
    (≈ 40 ms per non-streamed call on a kept-alive connection): the server's side of every
    connection has TCP_NODELAY set."""
    import socket

    from scripted_model.server import ScriptedModelServer

    seen: list[int] = []

    class Recording(ScriptedModelServer):
        def finish_request(self, request: Any, client_address: Any) -> None:
            super().finish_request(request, client_address)  # the handler's whole keep-alive loop
            seen.append(request.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    server = Recording(("127.0.0.1", 0))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client:
            answer = ask(client, [{"role": "user", "content": "say hi"}])
        # The client closed its connection; the handler's thread (a daemon: server_close does not
        # wait for it) leaves its keep-alive loop a moment later.
        wait_for(lambda: seen, timeout=10, what="the connection's handler to finish")
    finally:
        server.shutdown()
        server.server_close()

    assert answer.choices[0].message.content == "hi"
    assert seen and all(flag != 0 for flag in seen)
