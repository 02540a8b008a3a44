"""What the interfaces call to drive agent work. Each enqueues the engine after commit."""

import json
import uuid
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from agentops.domain import Conflict, InvalidArguments, NotFound
from sessions_app.engine.state import turn_move
from sessions_app.models import AgentProfile, AgentSession, Step, Turn
from sessions_app.services import event_record, session_create, session_lock, step_transition, turn_create


def _kick(turn_id: uuid.UUID) -> None:
    from sessions_app.tasks import turn_advance_task

    turn_advance_task.delay_on_commit(str(turn_id))  # type: ignore[attr-defined]


@transaction.atomic
def session_start(*, agent: AgentProfile, owner: User, input: str = "", title: str = "",
                  pinned: dict[str, Any] | None = None, budget: dict[str, Any] | None = None,
                  metadata: dict[str, Any] | None = None,
                  idempotency_key: str = "") -> tuple[AgentSession, Turn | None]:
    """Create a session and, with input, its first turn; the engine starts after commit."""
    if not title and input:
        title = input.strip().splitlines()[0][:80]
    session = session_create(agent=agent, owner=owner, title=title, pinned=pinned, budget=budget, metadata=metadata)
    turn = None
    if input and input.strip():
        turn = turn_create(session_id=session.id, input=input, actor=owner, idempotency_key=idempotency_key)
        _kick(turn.id)
    return session, turn


@transaction.atomic
def turn_submit(*, session_id: uuid.UUID | str, input: str, actor: User | None = None,
                idempotency_key: str = "") -> Turn:
    """Queue the next input of a session (409 ``turn_active`` while a turn runs)."""
    turn = turn_create(session_id=session_id, input=input, actor=actor, idempotency_key=idempotency_key)
    _kick(turn.id)
    return turn


@transaction.atomic
def session_cancel(*, session_id: uuid.UUID | str, actor: User | None = None) -> AgentSession:
    """Stop the active turn: cancel its open approvals and steps; a running command is killed
    by its sandbox, which polls the step's status. A session with no active turn is a no-op."""
    try:
        session = AgentSession.objects.select_for_update().get(pk=session_id)
    except (AgentSession.DoesNotExist, ValueError) as exc:
        raise NotFound(f"No session {session_id}") from exc
    turn = Turn.objects.select_for_update().filter(session=session, status__in=Turn.ACTIVE).first()
    if turn is None:
        return session
    from approvals_app.services import approvals_cancel_for_turn

    approvals_cancel_for_turn(turn_id=turn.id)
    for step in Step.objects.select_for_update().filter(turn=turn).exclude(status__in=Step.SETTLED):
        step_transition(step_id=step.id, to=Step.Status.CANCELLED, event_type="tool.cancelled"
                        if step.kind == Step.Kind.TOOL else "model.cancelled", error_code="cancelled")
    turn_move(turn.id, Turn.Status.CANCELLED, error_code="cancelled",
              error_message=f"Cancelled by {actor.get_username() if actor else 'the system'}.")
    session.refresh_from_db()
    return session


@transaction.atomic
def tool_output_submit(*, session_id: uuid.UUID | str, call_id: str, output: Any, success: bool = True) -> Step:
    """The integration's result for a client tool call; the turn resumes when none is left."""
    session_lock(session_id)
    steps = Step.objects.select_for_update().filter(session_id=uuid.UUID(str(session_id)), call_id=call_id,
                                                    kind=Step.Kind.TOOL)
    step = steps.order_by("-created_at").first()
    if step is None:
        raise NotFound(f"No tool call {call_id!r} in this session", details={"call_id": call_id})
    text = output if isinstance(output, str) else json.dumps(output)
    if len(text) > 1_000_000:
        raise InvalidArguments("The output is over 1,000,000 characters.", details={"field": "output"})
    result = {"status": "completed" if success else "failed", "output": text,
              "error_code": "" if success else "client_error"}
    if step.status in (Step.Status.COMPLETED, Step.Status.FAILED):
        if step.result == result:
            return step  # the same output posted again changes nothing
        raise Conflict("This tool call already has an output.", code="already_submitted")
    if step.status != Step.Status.RUNNING or step.lease_expires_at is not None:
        raise Conflict(f"This tool call is {step.status}; it does not wait for an output.", code="not_waiting")
    step = step_transition(step_id=step.id, to=Step.Status.COMPLETED if success else Step.Status.FAILED,
                           event_type="tool.completed" if success else "tool.failed",
                           event_payload={"result": result, "client": True}, result=result,
                           error_code=result["error_code"])
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="tool.output_submitted",
                 payload={"call_id": call_id, "success": success})
    _kick(step.turn_id)
    return step
