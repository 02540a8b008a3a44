"""Subagents on real worker processes: a pool of 2 runs a parent with 5 children (the waiting parent
holds no slot), and a SIGKILL of every worker while children run loses nothing."""

import os
import signal
from typing import Any

import pytest
from django.contrib.auth.models import User

from fanout_app.models import SubagentLink
from fanout_app.services import spawn_tool_seed
from sessions_app.engine.commands import session_start
from sessions_app.models import AgentProfile, AgentSession, Step, Turn
from tests import factories
from tests.helpers import WorkerFactory, finished, script, tool
from tests.waiting import wait_for
from tools_app.models import ToolDefinition


@pytest.fixture
def spawner(engine_agent: AgentProfile) -> AgentProfile:
    spawn_tool_seed()
    engine_agent.tools.set(ToolDefinition.objects.all())
    return engine_agent


def children(n: int, sleep_ms: int) -> str:
    tasks = [{"instructions": f"Check part {i}.", "input": f"sleep {sleep_ms}\nsay part {i} ok"} for i in range(n)]
    return tool("spawn_subagents", tasks=tasks)


def _start(agent: AgentProfile, owner: User, text: str) -> tuple[AgentSession, Turn]:
    session, turn = session_start(agent=agent, owner=owner, input=text)
    assert turn is not None
    return session, turn


def test_a_pool_of_two_runs_a_parent_with_five_children(spawner: AgentProfile, worker_process: WorkerFactory,
                                                        transactional_db: Any) -> None:
    owner = factories.user("oscar", groups=["operators"])
    worker_process(kind="worker", concurrency=2)
    worker_process(kind="gateway", concurrency=2)
    session, turn = _start(spawner, owner, script(children(5, 300), "say all five done"))
    # While it waits, the parent's step runs with no lease: no worker holds it.
    step = wait_for(lambda: Step.objects.filter(turn=turn, tool_name="spawn_subagents", status="running").first(),
                    60, "the spawn step to wait")
    assert step.lease_expires_at is None and step.lease_owner == ""
    turn = finished(turn, timeout=120)
    assert turn.status == Turn.Status.COMPLETED and turn.output_text == "all five done"
    result = Step.objects.get(pk=step.pk).result or {}
    assert [c["answer"] for c in result["subagents"]] == [f"part {i} ok" for i in range(5)]


def test_a_sigkilled_worker_while_children_run_loses_nothing(spawner: AgentProfile, worker_process: WorkerFactory,
                                                             transactional_db: Any) -> None:
    owner = factories.user("oscar", groups=["operators"])
    worker = worker_process(kind="worker", beat=True)
    gateway = worker_process(kind="gateway")
    session, turn = _start(spawner, owner, script(children(3, 4000), "say survived"))
    # Every child's model call is in flight (claimed, running) when both processes die.
    wait_for(lambda: Step.objects.filter(session__subagent_link__parent=session, kind="model",
                                         status="running").count() == 3 or None, 60, "3 children calling the model")
    for proc in (worker, gateway):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    worker_process(kind="worker", beat=True)
    worker_process(kind="gateway")
    turn = finished(turn, timeout=120)
    assert turn.status == Turn.Status.COMPLETED and turn.output_text == "survived"
    result = Step.objects.get(turn=turn, tool_name="spawn_subagents").result or {}
    assert [c["answer"] for c in result["subagents"]] == [f"part {i} ok" for i in range(3)]
    assert SubagentLink.objects.filter(parent=session).count() == 3  # spawned once, not again
