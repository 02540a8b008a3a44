"""bench/peers.py child: DBOS Transact (runs in bench/.venv-peers).

The agent loop is one durable workflow; every model call is a ``@DBOS.step`` (its reply is
checkpointed: a real model's output is not deterministic, so replay needs it) and every tool call
is a ``@DBOS.step``: 2N + 1 steps per turn. The model step calls the scripted model with the
openai SDK's transport (``_peers_common.chat``, as the floors). DBOS's system database is the benchmark's database. One
fresh workflow id per turn, run synchronously in the calling thread.
"""

import argparse
import uuid
from collections.abc import Callable
from typing import Any

from _peers_common import INSTRUCTIONS, TOOL_OUTPUT, Turn, chat, script, serve, timed, tool_param, versions


def setup(args: argparse.Namespace) -> tuple[Turn, Callable[[], None], str, dict[str, str]]:
    import openai
    import psycopg
    from dbos import DBOS, SetWorkflowID

    client = openai.OpenAI(base_url=args.model_url, api_key="not-needed", max_retries=0, timeout=60)
    tools = [tool_param()]

    @DBOS.step()
    def model_step(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return chat(client, messages, tools)

    @DBOS.step()
    def tool_step(name: str, arguments: str) -> str:
        return TOOL_OUTPUT

    @DBOS.workflow()
    def agent_turn(user: str) -> tuple[int, Any]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS},
                                          {"role": "user", "content": user}]
        done = 0
        while True:
            message = model_step(messages)
            messages.append(message)
            if not message.get("tool_calls"):
                return done, message.get("content")
            for call in message["tool_calls"]:
                output = tool_step(call["function"]["name"], call["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
                done += 1

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS dbos CASCADE")
    DBOS(config={"name": "peers-bench", "system_database_url": args.dsn,
                 "log_level": "WARNING"})
    DBOS.launch()

    def run(n: int) -> tuple[int, Any]:
        with SetWorkflowID(f"peers-{uuid.uuid4().hex}"):
            done, answer = agent_turn(script(n))
        return done, answer

    def teardown() -> None:
        DBOS.destroy()
        client.close()

    about = "1 workflow per turn; each model call and each tool call a @DBOS.step (2N + 1 steps)"
    return timed(run), teardown, about, versions("dbos", "sqlalchemy", "psycopg", "openai")


if __name__ == "__main__":
    serve(setup)
