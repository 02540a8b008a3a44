"""bench/peers.py child: the plain psycopg floor (runs in bench/.venv-peers).

A loop in one process: model call (openai SDK transport, ``_peers_common.chat``, history in memory), the
no-op tool, then per tool step one transaction of 4 statements on one psycopg 3 connection:
INSERT the step (with its result), INSERT 2 events, UPDATE the turn's counter. The least a
design that persists every step can write.
"""

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from _peers_common import (
    INSTRUCTIONS,
    TOOL_OUTPUT,
    Turn,
    chat,
    floor_tables,
    script,
    serve,
    timed,
    tool_param,
    versions,
)

PREFIX = "peers_pg_"


def setup(args: argparse.Namespace) -> tuple[Turn, Callable[[], None], str, dict[str, str]]:
    import openai
    import psycopg
    from psycopg.types.json import Jsonb

    floor_tables(args.dsn, PREFIX)
    conn = psycopg.connect(args.dsn)
    client = openai.OpenAI(base_url=args.model_url, api_key="not-needed", max_retries=0, timeout=60)
    tools = [tool_param()]

    def run(n: int) -> tuple[int, Any]:
        user = script(n)
        with conn.transaction():
            row = conn.execute(f"INSERT INTO {PREFIX}turn (input) VALUES (%s) RETURNING id", [user]).fetchone()
        assert row is not None
        turn_id = row[0]
        messages: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS},
                                          {"role": "user", "content": user}]
        done = seq = 0
        while True:
            message = chat(client, messages, tools)
            messages.append(message)
            if not message.get("tool_calls"):
                return done, message.get("content")
            for call in message["tool_calls"]:
                arguments = json.loads(call["function"]["arguments"] or "{}")
                output = TOOL_OUTPUT
                now = datetime.now(UTC)
                with conn.transaction():
                    conn.execute(f"INSERT INTO {PREFIX}step (turn_id, index, tool_name, call_id, arguments, result,"
                                 " created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                                 [turn_id, done, call["function"]["name"], call["id"],
                                  Jsonb(arguments), Jsonb({"output": output}), now])
                    for kind, payload in (("tool.started", {"arguments": arguments}),
                                          ("tool.completed", {"output": output})):
                        conn.execute(f"INSERT INTO {PREFIX}event (turn_id, seq, type, payload, created_at)"
                                     " VALUES (%s, %s, %s, %s, %s)", [turn_id, seq, kind, Jsonb(payload), now])
                        seq += 1
                    conn.execute(f"UPDATE {PREFIX}turn SET tool_calls = tool_calls + 1 WHERE id = %s", [turn_id])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
                done += 1

    def teardown() -> None:
        conn.close()
        client.close()

    about = ("plain loop + psycopg 3: per tool step 1 transaction (INSERT step, 2 INSERT event, UPDATE turn);"
             " openai SDK client.post (no create() transform)")
    return timed(run), teardown, about, versions("psycopg", "openai")


if __name__ == "__main__":
    serve(setup)
