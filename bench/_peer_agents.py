"""bench/peers.py child: the OpenAI Agents SDK with a PostgreSQL session (runs in bench/.venv-peers).

``Runner.run`` of an Agent whose model is ``OpenAIChatCompletionsModel`` on the scripted model
(AsyncOpenAI), one ``@function_tool``, tracing off, max_turns N + 5, with a ``SQLAlchemySession``
(SQLAlchemy async engine, asyncpg) on the benchmark's database: the SDK's PostgreSQL-backed
session. It stores the conversation items (read once per run, added at the end of the run), not a
resumable run state. One fresh session id per turn; one event loop for all turns.
"""

import argparse
import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from _peers_common import INSTRUCTIONS, TOOL_DESCRIPTION, TOOL_OUTPUT, Turn, script, serve, timed, versions


def setup(args: argparse.Namespace) -> tuple[Turn, Callable[[], None], str, dict[str, str]]:
    import psycopg
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
    from openai import AsyncOpenAI
    from sqlalchemy.ext.asyncio import create_async_engine

    set_tracing_disabled(True)
    calls = [0]

    @function_tool(description_override=TOOL_DESCRIPTION)
    def list_files(path: str) -> str:
        calls[0] += 1
        return TOOL_OUTPUT

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS agent_messages, agent_sessions")
    loop = asyncio.new_event_loop()
    client = AsyncOpenAI(base_url=args.model_url, api_key="not-needed", max_retries=0, timeout=60)
    agent = Agent(name="bench", instructions=INSTRUCTIONS, tools=[list_files],
                  model=OpenAIChatCompletionsModel(model="scripted", openai_client=client))
    url = args.dsn.replace("postgres://", "postgresql://", 1).replace("postgresql://", "postgresql+asyncpg://", 1)
    engine = create_async_engine(url)

    def run(n: int) -> tuple[int, Any]:
        calls[0] = 0
        session = SQLAlchemySession(f"peers-{uuid.uuid4().hex}", engine=engine, create_tables=True)
        result = loop.run_until_complete(Runner.run(agent, script(n), session=session, max_turns=n + 5))
        return calls[0], result.final_output

    def teardown() -> None:
        loop.run_until_complete(engine.dispose())
        loop.run_until_complete(client.close())
        loop.close()

    about = ("Runner.run, OpenAIChatCompletionsModel (AsyncOpenAI), SQLAlchemySession on PostgreSQL (asyncpg),"
             " tracing off")
    return timed(run), teardown, about, versions("openai-agents", "openai", "sqlalchemy", "asyncpg")


if __name__ == "__main__":
    serve(setup)
