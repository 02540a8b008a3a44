"""bench/peers.py child: LangGraph + PostgresSaver (runs in bench/.venv-peers).

A StateGraph over the stock MessagesState: node "model" (langchain-openai's ChatOpenAI on the
scripted model, the tool bound) → ToolNode → "model" …, tools_condition ending the loop; compiled
with the sync PostgresSaver (psycopg 3, its own connection, tables set up in the benchmark's
database) and its default durability. One fresh thread_id per turn; recursion_limit 2N + 10.
"""

import argparse
import uuid
from collections.abc import Callable
from typing import Any

from _peers_common import INSTRUCTIONS, TOOL_DESCRIPTION, TOOL_OUTPUT, Turn, script, serve, timed, versions


def setup(args: argparse.Namespace) -> tuple[Turn, Callable[[], None], str, dict[str, str]]:
    import psycopg
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool(description=TOOL_DESCRIPTION)
    def list_files(path: str) -> str:
        return TOOL_OUTPUT

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS checkpoints, checkpoint_blobs, checkpoint_writes, checkpoint_migrations")
    saver_cm = PostgresSaver.from_conn_string(args.dsn)
    saver = saver_cm.__enter__()
    saver.setup()
    model = ChatOpenAI(model="scripted", base_url=args.model_url, api_key="not-needed",
                       max_retries=0, timeout=60).bind_tools([list_files])

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([list_files]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    app = graph.compile(checkpointer=saver)

    def run(n: int) -> tuple[int, Any]:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 2 * n + 10}
        state = app.invoke({"messages": [SystemMessage(INSTRUCTIONS), HumanMessage(script(n))]},
                           config)
        messages = state["messages"]
        return sum(isinstance(m, ToolMessage) for m in messages), messages[-1].content

    def teardown() -> None:
        saver_cm.__exit__(None, None, None)

    about = ("StateGraph(MessagesState): ChatOpenAI node → ToolNode → …; PostgresSaver (sync, default"
             " durability), fresh thread per turn")
    return timed(run), teardown, about, versions("langgraph", "langgraph-checkpoint-postgres", "langchain-openai",
                                                 "langchain-core", "openai")


if __name__ == "__main__":
    serve(setup)
