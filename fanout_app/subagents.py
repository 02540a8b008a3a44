"""The ``spawn_subagents`` tool: child sessions started by a parent's tool call, waited for without
a worker, collected into one structured tool result.

- gate (``subagents_spawn``, in the parent's tick, under its session lock): validate the task list
  (a bad list is a failed tool step the model reads, never a crash), create one child session per
  task (own workspace; the files handed over copied in under ``inputs/``; budgets carved out of the
  parent's remaining ones; lineage in ``SubagentLink``), start them, and leave the step *running
  without a lease*: the turn waits, no worker is held, the recovery sweeper leaves it alone.
- a child's turn ends (``subagent_turn_ended``, a ``sessions_app.hooks.TURN_ENDED`` hook): the
  parent's turn is ticked after commit. A parent's turn cancelled or failed cancels its children's
  active turns in the same transaction (locks go parent → child only, never back: no deadlock).
- poll (``subagents_collect``, every tick of the parent while the step waits): announce newly
  finished children on the parent's timeline; past the tool's timeout cancel the rest; once every
  child is over, complete the step with the children's answers and published files, and charge
  their usage to the parent's counters (children draw on the parent's budgets).

A lost wake-up is recovered by the quiet-turn sweeper, whose tick polls again: nothing lives in memory.
"""

import json
import shutil
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agentops import dispatch
from fanout_app.models import SubagentLink
from sessions_app.engine.tool_steps import event_result, session_workspace
from sessions_app.engine.turns import turn_cancel
from sessions_app.events import event_record
from sessions_app.models import AgentProfile, AgentSession, Artifact, Step, Turn
from sessions_app.services import session_create_with_turn, step_transition
from tools_app.selectors import tool_definitions_by_name, tool_names_of_agent

SPAWN_TOOL = "spawn_subagents"
MAX_HANDED_FILE_BYTES = 1_000_000
ANSWER_CHARS = 20_000
BUDGETS = (("max_tool_calls", "tool_calls"), ("max_model_calls", "model_calls"))

SPAWN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tasks": {
            "type": "array",
            "description": "One child session per task, run in parallel; you get every answer back at once.",
            "items": {
                "type": "object",
                "properties": {
                    "instructions": {"type": "string", "description": "What the subagent must do."},
                    "input": {"description": "The data it works on (text or JSON)."},
                    "agent": {"type": "string", "description": "An agent profile's slug; default: yours."},
                    "tools": {"type": "array", "items": {"type": "string"},
                              "description": "A subset of the agent's tools; default: all of them."},
                    "files": {"type": "array", "items": {"type": "string"},
                              "description": "Paths in your workspace the subagent may read (under inputs/)."},
                },
                "required": ["instructions"],
            },
        },
    },
    "required": ["tasks"],
}


class TaskError(ValueError):
    """A task list the model must fix: the message is what it reads."""


def _fail(step: Step, message: str, code: str = "invalid_subagent_tasks") -> str:
    result = {"status": "failed", "error_code": code, "output": message}
    step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.FAILED, event_type="tool.failed",
                    event_payload={"result": result}, result=result, error_code=code, error_message=message)
    AgentSession.objects.filter(pk=step.session_id).update(tool_calls=F("tool_calls") + 1)
    return Step.Status.FAILED


def _depth_and_path(session: AgentSession) -> tuple[int, str, uuid.UUID]:
    link = SubagentLink.objects.filter(child=session).first()
    if link is None:
        return 0, session.agent.slug, session.id
    return link.depth, link.agent_path, link.root_id


def _budget_shares(session: AgentSession, n: int) -> dict[str, int | None]:
    """Each child's share of what the parent has left (None: the parent has no such budget)."""
    shares: dict[str, int | None] = {}
    for cap_name, used_name in BUDGETS:
        cap = getattr(session, cap_name)
        if cap is None:
            shares[cap_name] = None
            continue
        left = cap - getattr(session, used_name)
        if cap_name == "max_tool_calls":
            left -= 1  # the spawn call itself, counted when it settles (a budget of 4 ended at 5 of 4)
        share = left // n
        if share < 1:
            raise TaskError(f"Your {cap_name.removeprefix('max_')} budget has {left} left: not enough for {n} "
                            f"subagents (each needs at least 1). Use fewer subagents.")
        shares[cap_name] = share
    if session.max_tokens is not None:
        left = session.max_tokens - session.prompt_tokens - session.completion_tokens
        if left // n < 1:
            raise TaskError(f"Your token budget has {left} left: not enough for {n} subagents.")
        shares["max_tokens"] = left // n
    shares["max_wall_seconds"] = session.max_wall_seconds
    return shares


def validate_tasks(arguments: dict[str, Any], session: AgentSession, depth: int) -> list[dict[str, Any]]:
    """The tasks, checked and normalised (agent profile resolved). Raises TaskError."""
    tasks = arguments.get("tasks")
    max_fanout = settings.AGENTOPS_SUBAGENT_MAX_FANOUT
    max_depth = settings.AGENTOPS_SUBAGENT_MAX_DEPTH
    if not isinstance(tasks, list) or not tasks:
        raise TaskError("`tasks` must be a non-empty list of {instructions, input?, agent?, tools?, files?}.")
    if len(tasks) > max_fanout:
        raise TaskError(f"{len(tasks)} tasks; one call may start at most {max_fanout} subagents. Split the work.")
    if depth + 1 > max_depth:
        raise TaskError(f"This session is a subagent at depth {depth}; subagents may nest at most {max_depth} "
                        "deep. Do the work yourself.")
    known_tools = tool_definitions_by_name()
    checked = []
    for i, task in enumerate(tasks):
        where = f"task {i}"
        if not isinstance(task, dict):
            raise TaskError(f"{where}: must be an object with `instructions`.")
        unknown = set(task) - {"instructions", "input", "agent", "tools", "files"}
        if unknown:
            raise TaskError(f"{where}: unknown fields {sorted(unknown)}.")
        instructions = task.get("instructions")
        if not isinstance(instructions, str) or not instructions.strip():
            raise TaskError(f"{where}: `instructions` must be a non-empty string.")
        slug = task.get("agent")
        agent = session.agent
        if slug is not None:
            found = AgentProfile.objects.filter(slug=slug, team_id=session.team_id, enabled=True).first() \
                if isinstance(slug, str) else None
            if found is None:
                raise TaskError(f"{where}: no enabled agent profile {slug!r} in this team.")
            agent = found
        tools = task.get("tools")
        if tools is not None:
            if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
                raise TaskError(f"{where}: `tools` must be a list of tool names.")
            allowed = tool_names_of_agent(agent.pk)
            bad = [t for t in tools if t not in known_tools or t not in allowed]
            if bad:
                raise TaskError(f"{where}: unknown tools or tools the agent {agent.slug!r} does not have: {bad}; "
                                f"it has: {sorted(allowed)}.")
        files = task.get("files") or []
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise TaskError(f"{where}: `files` must be a list of paths in your workspace.")
        checked.append({"instructions": instructions, "input": task.get("input"), "agent": agent,
                        "tools": tools, "files": files})
    return checked


def _hand_over(parent_ws: Path, child_ws: Path, files: list[str], where: str) -> None:
    """Copy the files the parent hands over into the child's ``inputs/`` (read access, no sharing)."""
    root = parent_ws.resolve()
    for rel in files:
        source = (root / rel).resolve()
        if root not in source.parents or not source.is_file():
            raise TaskError(f"{where}: no file {rel!r} in your workspace.")
        if source.stat().st_size > MAX_HANDED_FILE_BYTES:
            raise TaskError(f"{where}: {rel!r} is over {MAX_HANDED_FILE_BYTES} bytes.")
        target = child_ws / "inputs" / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        st = child_ws.stat()
        for node in (target, *[p for p in target.parents if child_ws in p.parents]):
            try:
                shutil.chown(node, st.st_uid, st.st_gid)
            except PermissionError:
                break


def _child_input(task: dict[str, Any]) -> str:
    data = task["input"]
    if data is None:
        return task["instructions"]
    text = data if isinstance(data, str) else json.dumps(data, indent=1)
    return f"{task['instructions']}\n\n{text}"


def subagents_spawn(*, step: Step, session: AgentSession) -> str:
    """The gate of a ``spawn_subagents`` call: start the children, or fail the step with the reason.
    Call inside the tick's transaction (the parent's session is locked)."""
    depth, path, root_id = _depth_and_path(session)
    try:
        with transaction.atomic():  # all children or none: a bad task rolls back the others
            tasks = validate_tasks(step.arguments, session, depth)
            shares = _budget_shares(session, len(tasks))
            children = []
            for i, task in enumerate(tasks):
                metadata = {"agentops_tools": task["tools"]} if task["tools"] is not None else {}
                title = f"{(session.title or 'session')[:60]} › {i}: {task['instructions'].splitlines()[0][:70]}"
                child, turn = session_create_with_turn(agent=task["agent"], owner=session.owner,
                                                       input=_child_input(task), title=title, budget=shares,
                                                       metadata=metadata)
                if task["files"]:
                    _hand_over(session_workspace(session), session_workspace(child), task["files"], f"task {i}")
                link = SubagentLink.objects.create(
                    child=child, parent=session, root_id=root_id, parent_step=step, index=i, depth=depth + 1,
                    agent_path=f"{path} › {task['agent'].slug}#{i}",
                    task={"instructions": task["instructions"], "input": task["input"], "agent": task["agent"].slug,
                          "tools": task["tools"], "files": task["files"]})
                children.append({"index": i, "session_id": str(child.id), "title": child.title,
                                 "agent": task["agent"].slug, "agent_path": link.agent_path, "status": turn.status,
                                 "turn_id": str(turn.id),
                                 "instructions": task["instructions"]})  # the wire's create_subagent_call
                dispatch.turn_start_enqueue(turn.id, session_id=turn.session_id)
    except TaskError as exc:
        return _fail(step, str(exc))
    # Running without a lease: the turn waits (plan: ``waits``), the sweeper expires nothing.
    step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.RUNNING, known=step,
                    event_type="subagents.spawned", event_payload={"children": children})
    return Step.Status.RUNNING


def _child_turns(links: list[SubagentLink]) -> dict[uuid.UUID, Turn]:
    turns: dict[uuid.UUID, Turn] = {}
    for turn in Turn.objects.filter(session_id__in=[link.child_id for link in links]).order_by("index"):
        turns[turn.session_id] = turn  # the latest turn of each child
    return turns


def _child_result(link: SubagentLink, turn: Turn | None, artifacts: list[Artifact]) -> dict[str, Any]:
    status = turn.status if turn else "missing"
    out: dict[str, Any] = {"index": link.index, "session_id": str(link.child_id), "agent_path": link.agent_path,
                           "status": status, "answer": (turn.output_text if turn else "")[:ANSWER_CHARS]}
    if turn is not None and turn.error_code:
        out["error"] = {"code": turn.error_code, "message": turn.error_message[:500]}
    out["files"] = [{"path": a.path, "size": a.size, "sha256": a.sha256, "artifact_id": str(a.id)}
                    for a in artifacts]
    return out


def subagents_collect(*, step: Step, session: AgentSession) -> str:
    """Poll a waiting ``spawn_subagents`` step (the parent's tick, under its session lock)."""
    links = list(SubagentLink.objects.filter(parent_step=step).order_by("index"))
    turns = _child_turns(links)
    tool = tool_definitions_by_name().get(SPAWN_TOOL)
    timeout = tool.timeout_seconds if tool else 1800
    overdue = step.started_at is not None and timezone.now() - step.started_at > timedelta(seconds=timeout)
    for link in links:
        turn = turns.get(link.child_id)
        if overdue and turn is not None and turn.is_active:
            turns[link.child_id] = turn_cancel(turn_id=turn.id) or turn
            Turn.objects.filter(pk=turn.id).update(error_code="timed_out")
            turns[link.child_id].error_code = "timed_out"
    for link in links:
        turn = turns.get(link.child_id)
        if link.finish_announced or (turn is not None and turn.is_active):
            continue
        SubagentLink.objects.filter(pk=link.pk).update(finish_announced=True)
        event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="subagent.finished",
                     payload={"index": link.index, "session_id": str(link.child_id), "agent_path": link.agent_path,
                              "status": turn.status if turn else "missing",
                              "turn_id": str(turn.id) if turn else None,
                              "error_code": turn.error_code if turn else "",
                              "error_message": turn.error_message[:500] if turn else ""})
    if any(t.is_active for t in turns.values()):
        return Step.Status.RUNNING
    artifacts: dict[uuid.UUID, list[Artifact]] = {}
    for artifact in Artifact.objects.filter(session_id__in=[link.child_id for link in links]).order_by("created_at"):
        artifacts.setdefault(artifact.session_id, []).append(artifact)
    children = [_child_result(link, turns.get(link.child_id), artifacts.get(link.child_id, [])) for link in links]
    finished = sum(1 for c in children if c["status"] == Turn.Status.COMPLETED)
    result = {"status": "completed", "output": json.dumps({"subagents": children}, indent=1),
              "subagents": children, "summary": f"{finished} of {len(children)} subagents completed"}
    _charge_usage(session, [link.child_id for link in links])
    step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.COMPLETED, known=step,
                    event_type="tool.completed", event_payload={"result": event_result(result)}, result=result)
    return Step.Status.COMPLETED


def _charge_usage(session: AgentSession, child_ids: list[uuid.UUID]) -> None:
    """The children's usage counts against the parent's budgets (one tool call for the spawn itself)."""
    totals = {"tool_calls": 0, "model_calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
    for row in AgentSession.objects.filter(pk__in=child_ids).values(*totals):
        for name in totals:
            totals[name] += row[name]
    AgentSession.objects.filter(pk=session.id).update(
        tool_calls=F("tool_calls") + totals["tool_calls"] + 1, model_calls=F("model_calls") + totals["model_calls"],
        prompt_tokens=F("prompt_tokens") + totals["prompt_tokens"],
        completion_tokens=F("completion_tokens") + totals["completion_tokens"])
    for name, value in totals.items():
        setattr(session, name, getattr(session, name) + value + (1 if name == "tool_calls" else 0))


def subagent_turn_ended(turn: Turn) -> None:
    """``hooks.TURN_ENDED``: a child's end wakes its parent; a parent's cancel or failure cancels its
    children. Inside the transaction that ended ``turn`` (its session is locked)."""
    parent_turn = (SubagentLink.objects.filter(child_id=turn.session_id)
                   .values_list("parent_step__turn_id", flat=True).first())
    if parent_turn is not None:
        dispatch.tick_enqueue(parent_turn)
    if turn.status in (Turn.Status.CANCELLED, Turn.Status.FAILED):
        child_ids = SubagentLink.objects.filter(parent_step__turn_id=turn.id).values_list("child_id", flat=True)
        for child_turn in Turn.objects.filter(session_id__in=list(child_ids), status__in=Turn.ACTIVE).order_by("id"):
            turn_cancel(turn_id=child_turn.id)
