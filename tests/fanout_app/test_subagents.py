"""Subagents end to end with real workers: a Celery worker (threads), the model gateway, Redis,
PostgreSQL and the scripted model over HTTP."""

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from fanout_app.models import SubagentLink
from fanout_app.services import spawn_tool_seed
from scripted_model.server import ScriptedModelServer
from sessions_app.engine.commands import session_cancel, session_start
from sessions_app.models import AgentProfile, AgentSession, Event, Step, Turn
from tests import factories
from tests.helpers import assert_gap_free, finished, pending_approvals, script, tool
from tests.waiting import wait_for

pytestmark = pytest.mark.usefixtures("workers")


@pytest.fixture
def spawner(engine_agent: AgentProfile) -> AgentProfile:
    spawn_tool_seed()
    from tools_app.models import ToolDefinition

    engine_agent.tools.set(ToolDefinition.objects.all())
    return engine_agent


@pytest.fixture
def oscar(transactional_db: None) -> User:
    return factories.user("oscar", groups=["operators"])


@pytest.fixture(autouse=True)
def _every_timeline_gap_free(transactional_db: None) -> Iterator[None]:
    yield
    for session in AgentSession.objects.all():
        assert_gap_free(session.id)


def spawn(*tasks: dict[str, Any]) -> str:
    return tool("spawn_subagents", tasks=list(tasks))


def child_task(name: str, *lines: str, **extra: Any) -> dict[str, Any]:
    return {"instructions": f"Check {name}.", "input": "\n".join(lines), **extra}


def start(agent: AgentProfile, owner: User, text: str, **kwargs: Any) -> tuple[AgentSession, Turn]:
    session, turn = session_start(agent=agent, owner=owner, input=text, **kwargs)
    assert turn is not None
    return session, turn


def spawn_result(turn: Turn) -> Step:
    return Step.objects.get(turn=turn, tool_name="spawn_subagents")


def test_subagents_run_in_parallel_and_answer_the_parent(spawner: AgentProfile, oscar: User,
                                                         scripted_model: ScriptedModelServer) -> None:
    before, started = scripted_model.request_log.last_seq, time.time()
    session, turn = start(spawner, oscar, script(
        spawn(child_task("seats", "sleep 1500", "say seats ok"), child_task("arrival", "sleep 1500",
                                                                            "say arrives 09:10"),
              child_task("meals", "sleep 1500", "say meals ok")),
        "say all three checked"))
    turn = finished(turn, timeout=60)
    assert turn.status == Turn.Status.COMPLETED, (turn.error_code, turn.error_message)
    assert turn.output_text == "all three checked"
    step = spawn_result(turn)
    answers = {c["index"]: (c["status"], c["answer"]) for c in (step.result or {})["subagents"]}
    assert answers == {0: ("completed", "seats ok"), 1: ("completed", "arrives 09:10"), 2: ("completed", "meals ok")}
    links = list(SubagentLink.objects.filter(parent=session).order_by("index"))
    assert [link.depth for link in links] == [1, 1, 1] and all(link.root_id == session.id for link in links)
    # Each child asked the model once, or again only after a failed attempt its timeline shows
    # (model.retrying: a model call has no side effect and is retried); nothing else asks twice.
    # The scripted model is shared by the run: a request an earlier test left sleeping (its
    # "Check slow." child sleeps 30 s after its turn was cancelled) is logged when it ends, with a
    # seq after ours (CI: "assert 4 == 3"), so only the requests received since this test began count.
    logged = [e for e in scripted_model.logged_requests(after=before)
              if e.received_at >= started and e.last_user_message.startswith("Check")]
    asked = {name: [e for e in logged if e.last_user_message.startswith(f"Check {name}.")]
             for name in ("seats", "arrival", "meals")}
    retries = {name: Event.objects.filter(session_id=link.child_id, type="model.retrying").count()
               for name, link in zip(asked, links, strict=True)}
    timelines = {name: list(Event.objects.filter(session_id=link.child_id).order_by("seq")
                            .values_list("type", flat=True)) for name, link in zip(asked, links, strict=True)}
    assert len(logged) == sum(len(requests) for requests in asked.values()), logged
    assert {name: len(requests) for name, requests in asked.items()} == {
        name: 1 + retries[name] for name in asked}, (asked, timelines)
    assert all(Step.objects.filter(session_id=link.child_id, kind=Step.Kind.MODEL).count() == 1 for link in links)
    # Their model calls overlapped: each 1.5 s call (the answered one) started before any ended.
    answered = [requests[-1] for requests in asked.values()]
    assert max(e.received_at for e in answered) < min(e.finished_at for e in answered), answered
    # The parent's timeline announced each child, and the parent paid for its children's calls.
    types = list(session.events.values_list("type", flat=True))
    assert types.count("subagents.spawned") == 1 and types.count("subagent.finished") == 3
    session.refresh_from_db()
    assert session.model_calls == 2 + 3 and session.tool_calls == 1


def test_subagents_bad_task_lists_are_tool_errors_the_model_reads(spawner: AgentProfile, oscar: User,
                                                                   settings: Any) -> None:
    settings.AGENTOPS_SUBAGENT_MAX_FANOUT = 2
    _, turn = start(spawner, oscar, script(
        tool("spawn_subagents", tasks=[]),
        spawn(child_task("a", "say a"), child_task("b", "say b"), child_task("c", "say c")),
        spawn(child_task("a", "say a", agent="no-such-agent")),
        spawn(child_task("a", "say a", tools=["no_such_tool"])),
        spawn({"input": "no instructions"}),
        spawn(child_task("a", "say a", files=["../etc/passwd"])),
        "say gave up"))
    turn = finished(turn, timeout=60)
    assert turn.status == Turn.Status.COMPLETED and turn.output_text == "gave up"
    steps = list(Step.objects.filter(turn=turn, kind="tool").order_by("index"))
    assert [s.status for s in steps] == ["failed"] * 6
    messages = [(s.result or {})["output"] for s in steps]
    assert "non-empty list" in messages[0]
    assert "at most 2 subagents" in messages[1]
    assert "no enabled agent profile 'no-such-agent'" in messages[2]
    assert "no_such_tool" in messages[3]
    assert "instructions" in messages[4]
    assert "no file '../etc/passwd'" in messages[5]
    assert not SubagentLink.objects.exists() and AgentSession.objects.count() == 1


def test_subagents_cannot_nest_beyond_the_depth_limit(spawner: AgentProfile, oscar: User, settings: Any) -> None:
    settings.AGENTOPS_SUBAGENT_MAX_DEPTH = 1
    grandchild = spawn(child_task("deeper", "say never"))
    session, turn = start(spawner, oscar, script(spawn(child_task("nested", grandchild, "say child done")),
                                                 "say parent done"))
    turn = finished(turn, timeout=60)
    assert turn.status == Turn.Status.COMPLETED
    child = SubagentLink.objects.get(parent=session).child
    child_step = Step.objects.get(session=child, tool_name="spawn_subagents")
    assert child_step.status == "failed" and "at most 1 deep" in (child_step.result or {})["output"]
    assert AgentSession.objects.count() == 2


def test_subagent_approval_carries_lineage_and_cancel_cascades(spawner: AgentProfile, oscar: User,
                                                               reviewer: User) -> None:
    session, turn = start(spawner, oscar, script(
        spawn(child_task("files", tool("write_file", path="x.txt", content="x"), "say wrote"),
              child_task("slow", "sleep 30000", "say slow")),
        "say never"))
    link = wait_for(lambda: SubagentLink.objects.filter(parent=session, index=0).first(), 30, "the children")
    child_turn = Turn.objects.get(session_id=link.child_id)
    approval = pending_approvals(child_turn)[0]
    client = Client()
    client.force_login(reviewer)
    body = client.get(f"/api/approvals/{approval.request_id}").json()
    assert body["lineage"] == {"root_session_id": str(session.id), "parent_session_id": str(session.id),
                               "parent_step_id": str(spawn_result(turn).id), "depth": 1,
                               "agent_path": link.agent_path}
    page = client.get(f"/approvals/{approval.request_id}/").content.decode()
    assert link.agent_path.replace("›", "&rsaquo;") in page or link.agent_path in page
    lineage = client.get(f"/api/sessions/{link.child_id}/subagents").json()
    assert lineage["parent"]["session_id"] == str(session.id)
    assert len(client.get(f"/api/sessions/{session.id}/subagents").json()["children"]) == 2
    # The parent's cards show the child waiting for its reviewer, and keep polling while children work.
    cards = client.get(f"/sessions/{session.id}/subagents/").content.decode()
    assert "s-awaiting_approval" in cards and 'hx-trigger="every 3s"' in cards, cards

    session_cancel(session_id=session.id, actor=oscar)
    assert Turn.objects.get(pk=turn.pk).status == Turn.Status.CANCELLED
    for child_id in SubagentLink.objects.filter(parent=session).values_list("child_id", flat=True):
        assert Turn.objects.get(session_id=child_id).status == Turn.Status.CANCELLED
    approval.refresh_from_db()
    assert approval.status == "cancelled"
    cards = client.get(f"/sessions/{session.id}/subagents/").content.decode()
    assert "s-cancelled" in cards and "hx-trigger" not in cards, cards  # every child over: no more polling


def test_subagents_draw_on_the_parents_budget(spawner: AgentProfile, oscar: User) -> None:
    looping = [tool("list_files", path=".")] * 6
    session, turn = start(spawner, oscar, script(spawn(child_task("a", *looping, "say a"),
                                                       child_task("b", *looping, "say b")), "say done"),
                          budget={"max_model_calls": 7})
    turn = finished(turn, timeout=60)
    # The parent had 6 model calls left after its first: 3 for each child, whose 7 calls do not fit.
    children = list(AgentSession.objects.filter(subagent_link__parent=session))
    assert sorted(c.max_model_calls or 0 for c in children) == [3, 3]
    assert all(Turn.objects.get(session=c).error_code == "budget_exceeded" for c in children)
    step = spawn_result(turn)
    assert [c["status"] for c in (step.result or {})["subagents"]] == ["failed", "failed"]
    session.refresh_from_db()
    assert session.model_calls == 1 + 3 + 3
    # The parent's own budget is spent by its children: its next call would cross it.
    assert turn.status == Turn.Status.FAILED and turn.error_code == "budget_exceeded"


def test_subagents_tool_shares_leave_room_for_the_spawn_call_itself(spawner: AgentProfile, oscar: User) -> None:
    """With 4 tool calls, two children got 2 each and the parent ended at 5 of 4: the spawn call
    counts too (a subagents audit, 2026-12-04)."""
    twice = [tool("list_files", path=".")] * 2
    session, turn = start(spawner, oscar, script(spawn(child_task("a", *twice, "say a"),
                                                       child_task("b", *twice, "say b")), "say done"),
                          budget={"max_tool_calls": 4})
    finished(turn, timeout=60)
    children = list(AgentSession.objects.filter(subagent_link__parent=session))
    assert sorted(c.max_tool_calls or 0 for c in children) == [1, 1]
    session.refresh_from_db()
    assert session.tool_calls <= 4, session.tool_calls


def test_a_subagents_tool_subset_is_what_its_model_is_offered(spawner: AgentProfile, oscar: User) -> None:
    """The subset narrows what the model sees, not only what the gate lets through: a child told to
    use `read_file` is offered `read_file` alone (the parent, without a subset, sees every tool)."""
    from sessions_app.engine.model_step import Conversation

    session, turn = session_start(agent=spawner, owner=oscar, input=script("say hi"))
    assert turn is not None
    step = wait_for(lambda: Step.objects.filter(turn=turn, kind="model").order_by("index").first(), 30,
                    "the first model step")
    offered = {t["function"]["name"] for t in Conversation.load(step, deadline=0).tools}
    assert {"read_file", "run_command", "spawn_subagents"} <= offered
    AgentSession.objects.filter(pk=session.pk).update(metadata={"agentops_tools": ["read_file"]})
    offered = {t["function"]["name"] for t in Conversation.load(step, deadline=0).tools}
    assert offered == {"read_file"}


def test_a_spawn_past_its_timeout_is_woken_by_the_sweeper_and_times_its_children_out(
        spawner: AgentProfile, oscar: User) -> None:
    """The timeout was checked only when something ticked the parent, and only a child's end did:
    a 15-s spawn whose child ran 90 s waited the 90 s (a subagents audit, 2026-12-04)."""
    import time

    from sessions_app.engine import recovery
    from tools_app.models import ToolDefinition

    ToolDefinition.objects.filter(name="spawn_subagents").update(timeout_seconds=2)
    session, turn = start(spawner, oscar, script(spawn(child_task("slow", "sleep 60000", "say slow")),
                                                 "say gave up after {results}"))
    link = wait_for(lambda: SubagentLink.objects.filter(parent=session, index=0).first(), 30, "the child")
    wait_for(lambda: Turn.objects.filter(session_id=link.child_id, status="running").exists(), 30, "the child running")
    time.sleep(2.5)  # past the spawn's timeout; the child's model call still has ~55 s to go
    assert recovery.sweep()["waits_overdue"] == 1
    done = finished(turn, timeout=30)
    assert done.status == "completed" and done.output_text.startswith("gave up after"), done.output_text
    child = Turn.objects.get(session_id=link.child_id)
    assert child.status == Turn.Status.CANCELLED and child.error_code == "timed_out"
