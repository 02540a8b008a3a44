"""What every system of bench/peers.py shares: the work, the child protocol, the floors' tables.

Standard library only (psycopg imported where used): the peers' children run in bench/.venv-peers,
agentops's and the Django floor's in the project's .venv, and both import this module.

The work: one turn whose zero-latency model (the project's scripted model server, over HTTP through
the openai SDK) asks N times for one ``list_files {"path": "."}`` call, one call per reply, then
answers "done": N + 1 model calls, N tool calls. A peer's tool is a no-op returning a constant;
agentops's is its built-in ``list_files`` on the session's empty workspace.

Child protocol: a child is started with ``--model-url URL --dsn DSN``, sets itself up, writes one
JSON line ``{"ready": true, "about": ..., "versions": {...}}`` to its protocol stream, then for each
line ``{"n": N}`` read from stdin runs one turn and writes ``{"ms": wall ms, "tool_calls": N}``.
A failed turn writes ``{"error": traceback}`` and the child exits. End of stdin: the child tears
down and exits. The protocol stream is the original stdout; the child's own stdout goes to
stderr, so a library that prints cannot break the protocol.
"""

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from typing import Any, TextIO

INSTRUCTIONS = "You are a benchmark agent."
ANSWER = "done"
TOOL_NAME = "list_files"
TOOL_DESCRIPTION = "List the files in a directory of the workspace."
TOOL_OUTPUT = "(empty directory)"

# The floors' rows per tool step, one transaction: the step (with its result), two events
# (tool.started, tool.completed) and the turn's counter. The psycopg floor and the Django floor
# write the same rows into tables of their own (prefix peers_pg_ / peers_dj_).
FLOOR_DDL = """
DROP TABLE IF EXISTS {p}event, {p}step, {p}turn;
CREATE TABLE {p}turn (id bigserial PRIMARY KEY, input text NOT NULL, tool_calls integer NOT NULL DEFAULT 0,
                      created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE {p}step (id bigserial PRIMARY KEY, turn_id bigint NOT NULL REFERENCES {p}turn(id),
                      index integer NOT NULL, tool_name text NOT NULL, call_id text NOT NULL,
                      arguments jsonb NOT NULL, result jsonb NOT NULL, created_at timestamptz NOT NULL,
                      UNIQUE (turn_id, index));
CREATE TABLE {p}event (id bigserial PRIMARY KEY, turn_id bigint NOT NULL REFERENCES {p}turn(id),
                       seq integer NOT NULL, type text NOT NULL, payload jsonb NOT NULL,
                       created_at timestamptz NOT NULL, UNIQUE (turn_id, seq));
"""


def script(n: int) -> str:
    """The user message: the scripted model plays one line per reply (see scripted_model)."""
    return "\n".join([f'tool {TOOL_NAME} {{"path": "."}}'] * n + [f"say {ANSWER}"])


def tool_param() -> dict[str, Any]:
    """The one tool, as chat-completions ``tools`` carries it (the floors and DBOS send this)."""
    return {"type": "function", "function": {
        "name": TOOL_NAME, "description": TOOL_DESCRIPTION,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


def chat(client: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """One non-streamed chat completion through the openai SDK's transport (``client.post``), the way
    agentops's engine calls it (streamed there): ``chat.completions.create()`` first transforms the
    request, walking the whole history on every call (≈ 150 ms a call at N = 400 on this machine),
    a cost of that SDK method, not of persisting a step. The floors and DBOS (whose model call is the
    user's own code) call the model this way; LangGraph and the Agents SDK through their own
    OpenAI clients (ChatOpenAI, OpenAIChatCompletionsModel), which call ``create()``."""
    from openai.types.chat import ChatCompletion

    reply = client.post("/chat/completions", body={"model": "scripted", "messages": messages, "tools": tools},
                        cast_to=ChatCompletion)
    message: dict[str, Any] = reply.choices[0].message.model_dump(exclude_none=True)
    return message


def floor_loop(client: Any, user: str, record: Callable[[int, dict[str, Any], dict[str, Any], str], None]
               ) -> tuple[int, Any]:
    """The two floors' turn: call the model until it answers without tool calls; per tool call,
    ``record(index, call, arguments, output)`` persists the step (one transaction, the floor's own way)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": user}]
    tools = [tool_param()]
    done = 0
    while True:
        message = chat(client, messages, tools)
        messages.append(message)
        if not message.get("tool_calls"):
            return done, message.get("content")
        for call in message["tool_calls"]:
            arguments = json.loads(call["function"]["arguments"] or "{}")
            record(done, call, arguments, TOOL_OUTPUT)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": TOOL_OUTPUT})
            done += 1


def floor_tables(dsn: str, prefix: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(FLOOR_DDL.format(p=prefix))


def versions(*packages: str) -> dict[str, str]:
    found = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "?"
    return found


def check_turn(n: int, tool_calls: int, answer: Any) -> None:
    if tool_calls != n or answer != ANSWER:
        raise RuntimeError(f"turn N={n}: {tool_calls} tool calls, answer {answer!r} (expected {n}, {ANSWER!r})")


Turn = Callable[[int], dict[str, Any]]


def serve(setup: Callable[[argparse.Namespace], tuple[Turn, Callable[[], None], str, dict[str, str]]]) -> None:
    """Run a child: ``setup(args)`` returns (turn(n) -> result, teardown(), about, versions)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-url", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--system", default="")
    args = parser.parse_args()
    protocol: TextIO = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    teardown: Callable[[], None] | None = None
    try:
        turn, teardown, about, found = setup(args)
        _send(protocol, {"ready": True, "about": about, "versions": found})
        for line in sys.stdin:
            if not line.strip():
                continue
            n = int(json.loads(line)["n"])
            result = turn(n)
            _send(protocol, result)
    except BaseException:
        _send(protocol, {"error": traceback.format_exc()})
        raise
    finally:
        if teardown is not None:
            teardown()


def timed(run: Callable[[int], tuple[int, Any]]) -> Turn:
    """A turn function timed in-process: ``run(n)`` returns (tool calls made, final answer)."""

    def turn(n: int) -> dict[str, Any]:
        started = time.perf_counter()
        tool_calls, answer = run(n)
        ms = (time.perf_counter() - started) * 1000
        check_turn(n, tool_calls, answer)
        return {"ms": ms, "tool_calls": tool_calls}

    return turn


def _send(stream: TextIO, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()
