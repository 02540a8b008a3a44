"""The request log: in memory on the server, over HTTP at /_log, and as JSON lines in a file."""

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from scripted_model.request_log import RequestLog
from scripted_model.server import ScriptedModelServer, start_in_thread
from tests.scripted_model.chat import ask, assistant_turn, tool_result

FIELDS = {"seq", "received_at", "finished_at", "model", "message_count", "last_user_message", "position", "kind",
          "status", "prompt_tokens", "purpose", "system"}


@pytest.fixture
def fresh_server() -> Iterator[ScriptedModelServer]:
    """A server of its own per test, so sequence numbers start at 1."""
    server, _ = start_in_thread()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def fresh_client(fresh_server: ScriptedModelServer) -> OpenAI:
    return OpenAI(base_url=fresh_server.base_url, api_key="x", max_retries=0, timeout=10)


def _play_four_requests(client: OpenAI) -> None:
    """A tool call, its follow-up answer, a scripted failure, and a slow answer with a long script."""
    script = 'tool read_file {"path": "a.txt"}\nsay done'
    messages: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": script}]
    first = ask(client, messages)
    call = first.choices[0].message.tool_calls[0]
    messages += [assistant_turn(first.choices[0].message), tool_result(call.id, "contents")]
    assert ask(client, messages).choices[0].message.content == "done"
    with pytest.raises(openai.InternalServerError):
        ask(client, [{"role": "user", "content": "error 503\nsay later"}])
    ask(client, [{"role": "user", "content": "sleep 200\nsay " + "x" * 300}])


def test_request_log_records_each_answer_in_memory(fresh_server: ScriptedModelServer, fresh_client: OpenAI) -> None:
    started = time.time()
    _play_four_requests(fresh_client)
    with httpx.Client(base_url=fresh_server.base_url) as http:  # rejected before planning: not logged
        assert http.post("/chat/completions", json={"model": "scripted", "messages": []}).status_code == 400

    # No waiting: an entry is recorded before its response is sent.
    entries = fresh_server.logged_requests()

    assert [e.seq for e in entries] == [1, 2, 3, 4]
    assert [(e.kind, e.status, e.position, e.message_count) for e in entries] == [
        ("tool_calls", 200, 0, 2), ("text", 200, 1, 4), ("error", 503, 0, 1), ("text", 200, 0, 1)]
    assert {e.model for e in entries} == {"scripted"}
    assert entries[0].last_user_message == entries[1].last_user_message == 'tool read_file {"path": "a.txt"}\nsay done'
    assert entries[3].last_user_message == ("sleep 200\nsay " + "x" * 300)[:200]
    assert all(started <= e.received_at <= e.finished_at <= time.time() for e in entries)
    assert entries[3].finished_at - entries[3].received_at >= 0.2  # the scripted sleep is inside the entry
    assert [e.seq for e in fresh_server.logged_requests(after=2)] == [3, 4]
    entries.clear()  # a copy: the server's log is untouched
    assert len(fresh_server.logged_requests()) == 4


def test_request_log_wait_for_requests_returns_once_they_are_answered(
        fresh_server: ScriptedModelServer, fresh_client: OpenAI) -> None:
    def later() -> None:
        time.sleep(0.3)
        for n in range(2):
            ask(fresh_client, [{"role": "user", "content": f"say answer {n}"}])

    with ThreadPoolExecutor(max_workers=1) as pool:
        sent = pool.submit(later)
        entries = fresh_server.wait_for_requests(2, timeout=10)
        sent.result()

    assert [(e.seq, e.last_user_message) for e in entries] == [(1, "say answer 0"), (2, "say answer 1")]
    mark = fresh_server.request_log.last_seq
    with pytest.raises(TimeoutError, match="0 of 1 chat-completions requests after seq 2"):
        fresh_server.wait_for_requests(1, after=mark, timeout=0.1)
    ask(fresh_client, [{"role": "user", "content": "say one more"}])
    assert [e.seq for e in fresh_server.wait_for_requests(1, after=mark, timeout=10)] == [3]


def test_request_log_keeps_the_last_10000_entries() -> None:
    log = RequestLog()
    for _ in range(10_001):
        log.record(received_at=0.0, model="m", message_count=1, last_user_message="", position=0, kind="text",
                   status=200)

    entries = log.wait_for(10_001, timeout=0)

    assert len(entries) == 10_000
    assert (entries[0].seq, entries[-1].seq) == (2, 10_001)


def test_request_log_served_over_http(fresh_server: ScriptedModelServer, fresh_client: OpenAI) -> None:
    _play_four_requests(fresh_client)
    root = fresh_server.base_url.removesuffix("/v1")

    with httpx.Client(base_url=root) as http:
        everything = http.get("/_log")
        later = http.get("/_log", params={"after": 2})
        bad = http.get("/_log", params={"after": "x"})

    assert everything.status_code == 200
    assert everything.json() == [e.as_json() for e in fresh_server.logged_requests()]
    assert [set(entry) for entry in everything.json()] == [FIELDS] * 4
    assert [(e["seq"], e["kind"], e["status"]) for e in later.json()] == [(3, "error", 503), (4, "text", 200)]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "after"


def test_request_log_over_http_needs_the_api_key() -> None:
    server, base_url = start_in_thread(api_key="right")
    try:
        root = base_url.removesuffix("/v1")
        without = httpx.get(f"{root}/_log")
        with_key = httpx.get(f"{root}/_log", headers={"Authorization": "Bearer right"})
    finally:
        server.shutdown()
        server.server_close()

    assert without.status_code == 401
    assert with_key.status_code == 200 and with_key.json() == []


def test_request_log_appends_json_lines_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text('{"from": "an earlier run"}\n')
    server, base_url = start_in_thread(request_log_path=path)
    try:
        _play_four_requests(OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10))
        # Line buffered and written before the response: complete as soon as the client has its answer.
        lines = path.read_text().splitlines()
        in_memory = [e.as_json() for e in server.logged_requests()]
    finally:
        server.shutdown()
        server.server_close()

    assert [json.loads(line) for line in lines] == [{"from": "an earlier run"}, *in_memory]
    assert [entry["seq"] for entry in in_memory] == [1, 2, 3, 4]
