"""The one mapping between agentops's model and the OpenAI Agents API's wire types.

Nothing here writes or decides: the wire endpoints (``openai_api.api``) call agentops's own
services and selectors, and this module only says how their rows and events look on the wire
(``shared/research/openai-agents-api.md``). A session made through the wire is an ordinary
agentops session, and its wire id is its agentops id.

How agentops maps:

- agent profile ↔ ``agent`` (id = the profile's slug); its tools ↔ ``function`` tools. A function
  named like an agentops built-in is that built-in (the server runs it, under its approval mode);
  any other is a client tool the SDK runs (``tool_handlers``).
- session status: ``awaiting_approval`` and ``requires_action`` are both ``requires_action``.
- turn status: ``running`` is ``in_progress``; waiting for a reviewer or a client tool is ``waiting``.
- items of a turn: the user's input (``message``), each model reply with text (an assistant
  ``message``: ``final_answer`` when it called no tool, else ``commentary``), each client tool call
  (``function_call`` + ``function_call_output``), each built-in call (``mcp_call``, server label
  ``agentops``). ``output_index`` is the step's index in its turn.
- required actions: a client call waiting for its output is a ``function_call``; a call waiting
  for a reviewer is an ``mcp_approval_request`` whose ``request_id`` is agentops's approval request
  ID (answer it here only as an eligible reviewer, or in the queue).

One module (~600 lines) on purpose: issue 18 asks for exactly one mapping between agentops's model
and the wire types, so that nothing else decides how a row or an event looks on the wire; its
parts (agents, sessions, turns, items, events, subagents) share the item and status mappings
above. Parsing requests lives in ``parse``, the routes in ``api``, writes in ``services``.
"""

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.exceptions import ObjectDoesNotExist

from approvals_app.models import ApprovalRequest
from openai_api.parse import RESERVED_METADATA, WORKSPACE
from sessions_app.models import AgentProfile, AgentSession, Artifact, Step, Turn
from tools_app.models import ToolDefinition

SERVER_LABEL = "agentops"
SPAWN_TOOL = "spawn_subagents"  # fanout_app's tool: its calls are the wire's subagent items

SESSION_STATUS = {
    AgentSession.Status.IDLE: "idle",
    AgentSession.Status.IN_PROGRESS: "in_progress",
    AgentSession.Status.AWAITING_APPROVAL: "requires_action",
    AgentSession.Status.REQUIRES_ACTION: "requires_action",
    AgentSession.Status.FAILED: "failed",
}
TURN_STATUS = {
    Turn.Status.QUEUED: "queued",
    Turn.Status.RUNNING: "in_progress",
    Turn.Status.AWAITING_APPROVAL: "waiting",
    Turn.Status.REQUIRES_ACTION: "waiting",
    Turn.Status.COMPLETED: "completed",
    Turn.Status.FAILED: "failed",
    Turn.Status.CANCELLED: "cancelled",
}
# agentops's turn error codes → the wire's SessionTurnError codes.
TURN_ERROR_CODE = {
    "budget_exceeded": "usage_limit_exceeded",
    "authentication_error": "authentication_error",
    "policy_refusal": "misalignment_policy_violation",
    "model_error": "invalid_request",
    "model_unavailable": "server_overloaded",
    "lease_expired": "request_timeout",
}
SETTLED_TOOL_STATUS = {
    Step.Status.COMPLETED: "completed", Step.Status.FAILED: "failed", Step.Status.REJECTED: "failed",
    Step.Status.EXPIRED: "failed", Step.Status.CANCELLED: "incomplete",
}


def ts(value: datetime | str | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return int(value.timestamp())


def hexid(value: Any) -> str:
    return uuid.UUID(str(value)).hex


def usage_out(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens}


# --- agents and tools ------------------------------------------------------------------------

def tool_out(tool: ToolDefinition) -> dict[str, Any]:
    return {"type": "function", "name": tool.name, "description": tool.description,
            "parameters": tool.parameters_schema, "defer_loading": False, "async": None}


def _agent_config(agent: AgentProfile) -> dict[str, Any]:
    return {"id": agent.slug, "name": agent.name, "instructions": agent.instructions or None, "model": agent.model,
            "multi_agent": {"enabled": False, "max_concurrent_subagents": None},
            "reasoning": {"effort": None, "summary": None}, "service_tier": "auto",
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tools": [tool_out(t) for t in agent.tools.all()], "compaction": None, "experimental": None}


def agent_out(agent: AgentProfile) -> dict[str, Any]:
    return {**_agent_config(agent), "object": "agent", "created_at": ts(agent.created_at),
            "updated_at": ts(agent.updated_at), "metadata": agent.metadata or {}}


# --- sessions, turns, required actions --------------------------------------------------------

def function_call_action(*, turn_id: Any, call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function_call", "turn_id": str(turn_id), "call_id": call_id, "name": name,
            "arguments": json.dumps(arguments)}


def approval_action(*, request_id: Any, turn_id: Any, tool: str, arguments: Any, arguments_sha256: str,
                    risk: str = "") -> dict[str, Any]:
    return {"type": "mcp_approval_request", "request_id": str(request_id), "turn_id": str(turn_id),
            "request": {"type": "mcp_tool_call", "server_label": SERVER_LABEL, "name": tool,
                        "arguments": json.dumps(arguments),
                        "message": f"agentops asks a reviewer to approve {tool}"
                                   + (f" (risk: {risk})" if risk else "")
                                   + "; decide in the approval queue, or answer as an eligible reviewer.",
                        # Send it back as response.arguments_sha256: a decision on other arguments is refused.
                        "arguments_sha256": arguments_sha256}}


def required_actions(waiting_steps: Iterable[Step], approvals: Iterable[ApprovalRequest]) -> list[dict[str, Any]]:
    actions = [function_call_action(turn_id=s.turn_id, call_id=s.call_id, name=s.tool_name, arguments=s.arguments)
               for s in waiting_steps]
    actions += [approval_action(request_id=a.request_id, turn_id=a.turn_id, tool=a.tool_name, arguments=a.arguments,
                                arguments_sha256=a.arguments_sha256, risk=a.risk) for a in approvals]
    return actions




def session_metadata_out(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The integration's own pairs: agentops's keys (environment, tool subset) stay agentops's."""
    return {k: v for k, v in (metadata or {}).items() if k not in RESERVED_METADATA}


def environment_out(session: AgentSession) -> dict[str, Any]:
    """``none`` (no sandbox) when the session was started so; else ``self_hosted``: its workspace is
    on agentops's sandbox hosts, ``id`` the host it is pinned to (null until its first tick pins it,
    or on one machine). Reads ``session.placement`` (select it with the session in lists)."""
    if not session.has_sandbox:
        return {"type": "none"}
    try:
        host = session.placement.host.name
    except ObjectDoesNotExist:
        host = None
    # remote_url is a string in the SDK's model (an exec-server's URL): agentops has none to give.
    return {"type": "self_hosted", "id": host, "workspace_directory": WORKSPACE, "capability_directories": [],
            "remote_url": ""}


def session_out(session: AgentSession, *, actions: list[dict[str, Any]] | None = None,
                error: str | None = None) -> dict[str, Any]:
    status = SESSION_STATUS[AgentSession.Status(session.status)]
    return {
        "id": str(session.id), "object": "agent.session", "created_at": ts(session.created_at),
        "last_active_at": ts(session.last_event_at or session.updated_at), "agent": _agent_config(session.agent),
        "environment": environment_out(session), "status": status,
        "required_actions": (actions or []) if status == "requires_action" else [],
        "error": error if status == "failed" else None, "metadata": session_metadata_out(session.metadata),
        "vault_ids": [],
        "usage": usage_out(session.prompt_tokens, session.completion_tokens), "review": "none",
        # Required by the SDK's AgentSession (3.63): agentops's budgets are its own (tokens, calls), no USD.
        "spend_control": {"limit": None, "consumed": None},
    }


def turn_error(code: str, message: str) -> dict[str, str]:
    return {"code": TURN_ERROR_CODE.get(code, "internal_error" if not code else "server_error"),
            "message": message or code}


def turn_out(turn: Turn, agent_slug: str) -> dict[str, Any]:
    failed = turn.status == Turn.Status.FAILED
    return {"id": str(turn.id), "object": "agent.session.turn", "agent_id": agent_slug,
            "session_id": str(turn.session_id), "subagent_id": None, "created_at": ts(turn.created_at),
            "started_at": ts(turn.started_at), "completed_at": ts(turn.finished_at),
            "status": TURN_STATUS[Turn.Status(turn.status)],
            "error": turn_error(turn.error_code, turn.error_message) if failed else None,
            "usage": usage_out(turn.prompt_tokens, turn.completion_tokens)}


# --- items ------------------------------------------------------------------------------------

def user_message_item(turn_id: Any, text: str) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{hexid(turn_id)}", "role": "user", "turn_id": str(turn_id),
            "content": [{"type": "input_text", "text": text}], "phase": None, "status": "completed"}


def assistant_message_item(step_id: Any, turn_id: Any, text: str, *, final: bool | None,
                           status: str = "completed") -> dict[str, Any]:
    phase = None if final is None else "final_answer" if final else "commentary"
    return {"type": "message", "id": f"msg_{hexid(step_id)}", "role": "assistant", "turn_id": str(turn_id),
            "content": [{"type": "output_text", "text": text}] if status == "completed" or text else [],
            "phase": phase, "status": status}


def function_call_item(step_id: Any, turn_id: Any, call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{hexid(step_id)}", "turn_id": str(turn_id), "call_id": call_id,
            "name": name, "arguments": arguments, "status": "completed"}


def function_call_output_item(step_id: Any, turn_id: Any, call_id: str, result: Any, status: str) -> dict[str, Any]:
    result = result if isinstance(result, dict) else {}
    failed = status != "completed"
    return {"type": "function_call_output", "id": f"fco_{hexid(step_id)}", "turn_id": str(turn_id),
            "call_id": call_id, "output": None if failed else str(result.get("output", "")),
            "error": str(result.get("output") or result.get("error_code") or status) if failed else None,
            "status": status}


def mcp_call_item(step_id: Any, turn_id: Any, name: str, arguments: Any, *, status: str,
                  result: Any = None) -> dict[str, Any]:
    result = result if isinstance(result, dict) else {}
    failed = status == "failed"
    return {"type": "mcp_call", "id": f"mcp_{hexid(step_id)}", "turn_id": str(turn_id), "server_label": SERVER_LABEL,
            "name": name, "arguments": json.dumps(arguments),
            "output": None if failed or status == "in_progress" else result.get("output"),
            "error": (result.get("output") or result.get("error_code") or "failed") if failed else None,
            "status": status}


def _task_text(arguments: Any, index: int) -> str:
    tasks = arguments.get("tasks") if isinstance(arguments, dict) else None
    task = tasks[index] if isinstance(tasks, list) and 0 <= index < len(tasks) else {}
    return str((task or {}).get("instructions") or "") if isinstance(task, dict) else ""


def _answers(result: Any) -> list[dict[str, Any]]:
    """The children's answers a collected spawn step holds (its live event carries them in ``output``,
    the JSON the parent's model read; when that was cut for the live view, the history has them)."""
    if not isinstance(result, dict):
        return []
    answers = result.get("subagents")
    if answers is None and isinstance(result.get("output"), str):
        try:
            answers = json.loads(result["output"]).get("subagents")
        except (ValueError, AttributeError):
            answers = None
    return [c for c in answers or [] if isinstance(c, dict)]


def create_subagent_call_item(step_id: Any, turn_id: Any, index: int, *, agent_id: str, task: str,
                              subagent_id: str) -> dict[str, Any]:
    """One child session a ``spawn_subagents`` call started (``agentops_subagent_id``: the child,
    the id of ``sessions.subagents``)."""
    return {"type": "create_subagent_call", "id": f"csc_{hexid(step_id)}_{index}", "turn_id": str(turn_id),
            "agent_id": agent_id, "content": [{"type": "output_text", "text": task, "annotations": []}],
            "model": None, "reasoning_effort": None, "status": "completed", "agentops_subagent_id": subagent_id}


def wait_for_subagents_call_item(step_id: Any, turn_id: Any, *, agent_id: str, subagent_ids: list[str],
                                 status: str) -> dict[str, Any]:
    return {"type": "wait_for_subagents_call", "id": f"wsc_{hexid(step_id)}", "turn_id": str(turn_id),
            "sender_agent_id": agent_id, "recipient_agent_ids": subagent_ids, "status": status}


def agent_message_item(step_id: Any, turn_id: Any, index: int, *, subagent_id: str, agent_id: str,
                       text: str) -> dict[str, Any]:
    """A child's answer, as it reached its parent."""
    return {"type": "agent_message", "id": f"amsg_{hexid(step_id)}_{index}", "turn_id": str(turn_id),
            "sender_agent_id": subagent_id, "recipient_agent_id": agent_id,
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def spawn_items(step: Step, *, agent_id: str, children: list[dict[str, Any]] | None,
                status: str) -> list[tuple[int | None, dict[str, Any]]]:
    """A ``spawn_subagents`` step as the wire's multi-agent items: one ``create_subagent_call`` per
    child, a ``wait_for_subagents_call`` for them all, and each child's answer as an
    ``agent_message`` once the step has collected them (``status``: the wait's status)."""
    answered = _answers(step.result)
    kids = answered or children or []
    ids = [str(c.get("session_id", "")) for c in kids]
    items: list[tuple[int | None, dict[str, Any]]] = [
        (step.index, create_subagent_call_item(step.id, step.turn_id, int(c.get("index", i)), agent_id=agent_id,
                                               task=str(c.get("instructions") or "")
                                               or _task_text(step.arguments, int(c.get("index", i))),
                                               subagent_id=ids[i]))
        for i, c in enumerate(kids)]
    items.append((step.index, wait_for_subagents_call_item(step.id, step.turn_id, agent_id=agent_id,
                                                           subagent_ids=ids, status=status)))
    items += [(None, agent_message_item(step.id, step.turn_id, int(c.get("index", i)), subagent_id=ids[i],
                                        agent_id=agent_id, text=str(c.get("answer") or "")))
              for i, c in enumerate(answered)]
    return items


def step_items(step: Step, client_tools: frozenset[str], *, agent_id: str = "",
               children: list[dict[str, Any]] | None = None) -> list[tuple[int | None, dict[str, Any]]]:
    """A step's items with their output index (``agent_id``: the wire id of the agent whose step it
    is; ``children``: a ``spawn_subagents`` step's child sessions, while its result lacks them)."""
    if step.kind == Step.Kind.MODEL:
        text = str((step.message or {}).get("content") or "")
        if not text:
            return []
        final = not (step.message or {}).get("tool_calls")
        status = "completed" if step.status == Step.Status.COMPLETED else "incomplete"
        return [(step.index, assistant_message_item(step.id, step.turn_id, text, final=final, status=status))]
    settled = SETTLED_TOOL_STATUS.get(Step.Status(step.status))
    if step.tool_name in client_tools:
        items: list[tuple[int | None, dict[str, Any]]] = [
            (step.index, function_call_item(step.id, step.turn_id, step.call_id, step.tool_name, step.arguments))]
        if settled:
            items.append((None, function_call_output_item(step.id, step.turn_id, step.call_id, step.result, settled)))
        return items
    if step.status == Step.Status.PLANNED:
        return []
    if step.tool_name == SPAWN_TOOL and (children or _answers(step.result)):
        return spawn_items(step, agent_id=agent_id, children=children, status=settled or "in_progress")
    return [(step.index, mcp_call_item(step.id, step.turn_id, step.tool_name, step.arguments,
                                       status=settled or "in_progress", result=step.result))]


def turn_items(turn: Turn, steps: Iterable[Step], client_tools: frozenset[str], *, agent_id: str = "",
               children: dict[str, list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """Every item of a turn, in order: the input, then what each step produced (``children``: the
    child sessions of the turn's ``spawn_subagents`` steps, by step id)."""
    items = [user_message_item(turn.id, turn.input)]
    for step in steps:
        items += [item for _, item in step_items(step, client_tools, agent_id=agent_id,
                                                 children=(children or {}).get(str(step.id)))]
    return items


# --- artifacts --------------------------------------------------------------------------------

def artifact_out(artifact: Artifact, environment_id: str | None = None) -> dict[str, Any]:
    """``environment_id``: the host of its session's workspace (``environment_out``'s id)."""
    return {"id": str(artifact.id), "object": "agent.session.artifact", "session_id": str(artifact.session_id),
            "turn_id": str(artifact.turn_id) if artifact.turn_id else None, "environment_id": environment_id,
            "path": "/workspace/" + artifact.path.lstrip("/"), "size_bytes": artifact.size,
            "created_at": ts(artifact.created_at)}


def deleted(object_id: str, kind: str) -> dict[str, Any]:
    return {"id": object_id, "deleted": True, "object": f"{kind}.deleted"}


# --- the live translation of agentops events ---------------------------------------------------

@dataclass(frozen=True)
class StreamSeen:
    """What a client resuming after a seq saw of the active turns (``sessions_app.selectors``'s
    ``stream_seen``): the model steps whose message item was announced, the tool steps' arguments."""

    announced: frozenset[str] = frozenset()
    arguments: dict[str, Any] = field(default_factory=dict)


class WireStream:
    """Turns one session's agentops events (``Event.as_dict()``, in seq order) into wire events.

    It holds what a wire event repeats that an agentops event does not carry: the session
    snapshot, the open required actions (registered from ``tool.started`` of a client tool and
    ``approval.requested``, before the session's ``requires_action``), each turn's times, and
    which model steps have an announced message item. Start it from the state the stream's
    first event follows (``snapshot`` and ``actions`` read before it).
    """

    def __init__(self, *, snapshot: dict[str, Any], actions: list[dict[str, Any]] | None = None,
                 turns: Iterable[Turn] = (), client_steps: dict[str, str] | None = None,
                 seen: "StreamSeen | None" = None) -> None:
        self.snapshot = dict(snapshot)
        self.actions: dict[str, dict[str, Any]] = {self._key(a): a for a in actions or []}
        self.turns: dict[str, dict[str, Any]] = {}
        for turn in turns:
            self.turns[str(turn.id)] = turn_out(turn, self.snapshot["agent"]["id"])
        self.client_steps: dict[str, str] = dict(client_steps or {})  # step id → call id
        # A stream resumed after a seq starts from what the client saw up to it (``StreamSeen``): the
        # same agentops event then gives the same wire events, with the same event_ids, as live.
        self.announced: set[str] = set(seen.announced) if seen else set()  # model steps whose item was added
        self.arguments: dict[str, Any] = dict(seen.arguments) if seen else {}  # tool step id → its arguments
        self.indices: dict[str, int] = {}  # model step id → its index in the turn (the output index)
        self.opened: dict[str, int | None] = {}  # child session id → when its subagent.created was seen
        self.spawns: dict[str, list[dict[str, Any]]] = {}  # spawn step id → the children it started
        self.subagent_turns: dict[str, dict[str, Any]] = {}  # a child's turn id → its wire turn

    @staticmethod
    def _key(action: dict[str, Any]) -> str:
        return str(action.get("call_id") or action.get("request_id"))

    def translate(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._translate(event)
        for i, wire in enumerate(out):
            wire["event_id"] = f"evt_{event['seq']}_{i}"
        return out

    def _session_event(self, status: str) -> dict[str, Any]:
        self.snapshot["status"] = status
        self.snapshot["required_actions"] = list(self.actions.values()) if status == "requires_action" else []
        if status != "failed":
            self.snapshot["error"] = None
        return {"type": f"agent.session.{status}", "session": json.loads(json.dumps(self.snapshot))}

    def _turn(self, event: dict[str, Any], **changes: Any) -> dict[str, Any]:
        turn_id = str(event["turn_id"])
        turn = self.turns.setdefault(turn_id, {
            "id": turn_id, "object": "agent.session.turn", "agent_id": self.snapshot["agent"]["id"],
            "session_id": self.snapshot["id"], "subagent_id": None, "created_at": ts(event["created_at"]),
            "started_at": None, "completed_at": None, "status": "queued", "error": None, "usage": None})
        turn.update(changes)
        return dict(turn)

    def _translate(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind, payload = event["type"], event.get("payload") or {}
        sid, turn_id, step_id = self.snapshot["id"], event.get("turn_id"), event.get("step_id")
        at = ts(event["created_at"])
        base = {"session_id": sid, "turn_id": turn_id}
        if kind == "session.created":
            return [{"type": "agent.session.created", "session": self._session_event("idle")["session"]}]
        if kind == "session.status_changed":
            status = SESSION_STATUS.get(AgentSession.Status(payload["status"]), "in_progress") \
                if payload.get("status") in AgentSession.Status.values else "in_progress"
            self.snapshot["last_active_at"] = at
            return [self._session_event(status)]
        if kind == "turn.queued":
            turn = self._turn(event, created_at=at, status="queued")
            return [{"type": "agent.session.turn.created", **base, "turn": turn},
                    {"type": "agent.session.turn.item.added", **base,
                     "item": user_message_item(turn_id, str(payload.get("input", "")))}]
        if kind == "turn.started":
            started = self.turns.get(str(turn_id), {}).get("started_at") or at
            return [{"type": "agent.session.turn.in_progress", **base,
                     "turn": self._turn(event, status="in_progress", started_at=started)}]
        if kind in ("turn.awaiting_approval", "turn.requires_action"):
            self._turn(event, status="waiting")
            return []
        if kind in ("turn.completed", "turn.failed", "turn.cancelled"):
            status = kind.split(".", 1)[1]
            error = turn_error(str(payload.get("error_code", "")), str(payload.get("error_message", ""))) \
                if status == "failed" else None
            if error is not None:
                self.snapshot["error"] = error["message"]
            self.actions = {k: a for k, a in self.actions.items() if a.get("turn_id") != str(turn_id)}
            return [{"type": f"agent.session.turn.{status}", **base,
                     "turn": self._turn(event, status=status, completed_at=at, error=error)}]
        if kind == "model.started" and step_id:
            self.indices[step_id] = int(payload.get("index", 0))
            return []
        if kind == "model.delta" and step_id:
            out = []
            index = self.indices.get(step_id, 0)  # deltas carry only their text
            if step_id not in self.announced:
                self.announced.add(step_id)
                out.append({"type": "agent.session.turn.item.added", **base, "output_index": index,
                            "item": assistant_message_item(step_id, turn_id, "", final=None, status="in_progress")})
            out.append({"type": "agent.session.turn.output_text.delta", **base, "item_id": f"msg_{hexid(step_id)}",
                        "output_index": index, "content_index": 0, "delta": str(payload.get("text", ""))})
            return out
        if kind == "model.completed" and step_id:
            text = str(payload.get("content") or "")
            if not text:
                return []
            out = []
            index = payload.get("index", 0)
            item = assistant_message_item(step_id, turn_id, text, final=not payload.get("tool_calls"))
            if step_id not in self.announced:
                self.announced.add(step_id)
                out.append({"type": "agent.session.turn.item.added", **base, "output_index": index,
                            "item": {**item, "status": "in_progress", "content": []}})
            out.append({"type": "agent.session.turn.output_text.done", **base, "item_id": item["id"],
                        "output_index": index, "content_index": 0, "text": text})
            out.append({"type": "agent.session.turn.item.done", **base, "output_index": index, "item": item})
            return out
        if kind == "tool.started" and step_id:
            index, tool, arguments = payload.get("index", 0), str(payload.get("tool", "")), payload.get("arguments")
            if payload.get("client"):
                # Registered (the step is running, waiting for its output) in the transaction that
                # recorded this event: the SDK may post the result as soon as it sees item.added.
                call_id = str(payload.get("call_id", ""))
                self.client_steps[step_id] = call_id
                self.actions[call_id] = function_call_action(turn_id=turn_id, call_id=call_id, name=tool,
                                                             arguments=arguments)
                item = function_call_item(step_id, turn_id, call_id, tool, arguments)
                return [{"type": "agent.session.turn.item.added", **base, "output_index": index, "item": item},
                        {"type": "agent.session.turn.item.done", **base, "output_index": index, "item": item}]
            if tool == SPAWN_TOOL:  # its items come with the children it starts (subagents.spawned)
                return []
            self.arguments[step_id] = arguments
            return [{"type": "agent.session.turn.item.added", **base, "output_index": index,
                     "item": mcp_call_item(step_id, turn_id, tool, arguments or {}, status="in_progress")}]
        if kind in ("tool.completed", "tool.failed", "tool.rejected", "tool.expired", "tool.cancelled") and step_id:
            status = "completed" if kind == "tool.completed" else "incomplete" if kind == "tool.cancelled" \
                else "failed"
            result = payload.get("result")
            if payload.get("client") or step_id in self.client_steps:
                call_id = self.client_steps.get(step_id, "")
                self.actions.pop(call_id, None)
                return [{"type": "agent.session.turn.item.added", **base,
                         "item": function_call_output_item(step_id, turn_id, call_id, result, status)}]
            index = payload.get("index", 0)
            tool = str(payload.get("tool", ""))
            if tool == SPAWN_TOOL and (step_id in self.spawns or _answers(result)):
                return self._spawn_settled(event, base, status)
            if kind == "tool.rejected" and not result:  # its reason, as the items endpoint says it
                reason = payload.get("reason") or "(none given)"
                result = {"output": f"The reviewer rejected this call. Reason: {reason}"}
            # item.done is the whole item: the arguments its item.added carried (the settling event has none)
            arguments = payload.get("arguments") or self.arguments.pop(step_id, None) or {}
            done = {"type": "agent.session.turn.item.done", **base, "output_index": index,
                    "item": mcp_call_item(step_id, turn_id, tool, arguments, status=status, result=result)}
            if tool == SPAWN_TOOL:  # refused before it started a child: announced only now
                return [{**done, "type": "agent.session.turn.item.added"}, done]
            return [done]
        if kind == "tool.output_submitted":
            self.actions.pop(str(payload.get("call_id", "")), None)
            return []
        if kind == "approval.requested":
            action = approval_action(request_id=payload.get("request_id"), turn_id=turn_id,
                                     tool=str(payload.get("tool", "")), arguments=payload.get("arguments"),
                                     arguments_sha256=str(payload.get("arguments_sha256", "")),
                                     risk=str(payload.get("risk", "")))
            self.actions[action["request_id"]] = action
            return []
        if kind in ("approval.decided", "approval.expired", "approval.cancelled"):
            self.actions.pop(str(payload.get("request_id", "")), None)
            return []
        if kind == "subagents.spawned":  # this session's own children (nested ones: in their parent's stream)
            children = [c for c in payload.get("children") or [] if isinstance(c, dict)]
            self.spawns[str(step_id)] = children
            out = []
            for child in children:
                out.append({"type": "agent.session.subagent.created", "subagent": self._subagent(child, at, None)})
                out += self._subagent_turn(child, at, "queued")
            index = int(payload.get("index", 0))
            for _, item in spawn_items(self._spawn_step(event), agent_id=self.snapshot["agent"]["id"],
                                       children=children, status="in_progress"):
                out.append({"type": "agent.session.turn.item.added", **base, "output_index": index, "item": item})
                if item["type"] == "create_subagent_call":
                    out.append({"type": "agent.session.turn.item.done", **base, "output_index": index, "item": item})
            return out
        if kind == "subagent.finished":  # the child's turn ends, then the subagent closes
            status = str(payload.get("status", ""))
            ended = self._subagent_turn(payload, at, status) if status in ("completed", "failed", "cancelled") else []
            return [*ended, {"type": "agent.session.subagent.closed", "subagent": self._subagent(payload, at, at)}]
        return []

    def _subagent_turn(self, child: dict[str, Any], at: int | None, status: str) -> list[dict[str, Any]]:
        """A child session's turn as the root stream shows it (``turn.subagent_id`` set, so the SDK's
        stream helper, which follows the first root turn, does not take it for the caller's turn):
        ``created`` when the child starts, its terminal event when it finishes. The child's own items
        stay in its subagent's endpoints."""
        child_id, turn_id = str(child.get("session_id", "")), child.get("turn_id")
        if not turn_id:
            return []
        turn = self.subagent_turns.setdefault(str(turn_id), {
            "id": str(turn_id), "object": "agent.session.turn", "agent_id": child.get("agent") or child_id,
            "session_id": self.snapshot["id"], "subagent_id": child_id, "created_at": at, "started_at": None,
            "completed_at": None, "status": "queued", "error": None, "usage": None})
        turn["status"] = status
        if status != "queued":
            turn["completed_at"] = at
            turn["started_at"] = turn["started_at"] or turn["created_at"]
        if status == "failed":
            turn["error"] = turn_error(str(child.get("error_code", "")), str(child.get("error_message", "")))
        verb = "created" if status == "queued" else status
        return [{"type": f"agent.session.turn.{verb}", "session_id": self.snapshot["id"], "turn_id": str(turn_id),
                 "turn": dict(turn)}]

    def _spawn_step(self, event: dict[str, Any]) -> Step:
        """The spawn step as its events show it (unsaved: only what ``spawn_items`` reads)."""
        payload = event.get("payload") or {}
        arguments = payload.get("arguments") or {}
        return Step(id=event["step_id"], turn_id=event["turn_id"], index=int(payload.get("index", 0)),
                    tool_name=SPAWN_TOOL, arguments=arguments, result=payload.get("result"))

    def _spawn_settled(self, event: dict[str, Any], base: dict[str, Any], status: str) -> list[dict[str, Any]]:
        """The children's answers (``agent_message``), then the wait's ``item.done``."""
        index = int((event.get("payload") or {}).get("index", 0))
        items = spawn_items(self._spawn_step(event), agent_id=self.snapshot["agent"]["id"],
                            children=self.spawns.pop(str(event["step_id"]), None), status=status)
        out = []
        for _, item in items:
            if item["type"] == "agent_message":
                out.append({"type": "agent.session.turn.item.added", **base, "item": item})
        wait = next(item for _, item in items if item["type"] == "wait_for_subagents_call")
        out.append({"type": "agent.session.turn.item.done", **base, "output_index": index, "item": wait})
        return out

    def _subagent(self, child: dict[str, Any], at: int | None, closed_at: int | None) -> dict[str, Any]:
        """A child session as ``openai_api.wire_resources.subagent_out`` shows it, from its event."""
        child_id = str(child.get("session_id", ""))
        opened = self.opened.setdefault(child_id, at)
        return {"id": child_id, "object": "agent.session.subagent", "session_id": self.snapshot["id"],
                "parent_agent_id": self.snapshot["agent"]["id"], "name": child.get("title") or child.get("agent_path"),
                "instructions": None, "status": "active" if closed_at is None else "closed", "opened_at": opened,
                "closed_at": closed_at}
