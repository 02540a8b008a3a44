"""bench/peers.py child: the plain psycopg floor (runs in bench/.venv-peers).

A loop in one process: model call (openai SDK transport, ``_peers_common.chat``, history in memory), the
no-op tool, then per tool step one transaction of 4 statements on one psycopg 3 connection:
INSERT the step (with its result), INSERT 2 events, UPDATE the turn's counter. The least a
design that persists every step can write.
"""

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from _peers_common import (
    Turn,
    floor_loop,
    floor_tables,
    script,
    serve,
    timed,
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

    def run(n: int) -> tuple[int, Any]:
        user = script(n)
        with conn.transaction():
            row = conn.execute(f"INSERT INTO {PREFIX}turn (input) VALUES (%s) RETURNING id", [user]).fetchone()
        assert row is not None
        turn_id = row[0]

        def record(index: int, call: dict[str, Any], arguments: dict[str, Any], output: str) -> None:
            now = datetime.now(UTC)
            with conn.transaction():
                conn.execute(f"INSERT INTO {PREFIX}step (turn_id, index, tool_name, call_id, arguments, result,"
                             " created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                             [turn_id, index, call["function"]["name"], call["id"],
                              Jsonb(arguments), Jsonb({"output": output}), now])
                for seq, (kind, payload) in enumerate((("tool.started", {"arguments": arguments}),
                                                       ("tool.completed", {"output": output}))):
                    conn.execute(f"INSERT INTO {PREFIX}event (turn_id, seq, type, payload, created_at)"
                                 " VALUES (%s, %s, %s, %s, %s)", [turn_id, 2 * index + seq, kind, Jsonb(payload), now])
                conn.execute(f"UPDATE {PREFIX}turn SET tool_calls = tool_calls + 1 WHERE id = %s", [turn_id])

        return floor_loop(client, user, record)

    def teardown() -> None:
        conn.close()
        client.close()

    about = ("plain loop + psycopg 3: per tool step 1 transaction (INSERT step, 2 INSERT event, UPDATE turn);"
             " openai SDK client.post (no create() transform)")
    return timed(run), teardown, about, versions("psycopg", "openai")


if __name__ == "__main__":
    serve(setup)
