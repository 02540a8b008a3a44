"""The verification step: before a turn completes, a model call judges its answer against the
session's acceptance criteria.

A step like a model call (``Step.Kind.VERIFICATION``): planned by the tick (``plan`` says VERIFY)
with the answer and the round in its ``arguments``, claimed with a lease, called by the gateway,
recorded by the lease holder only, retried by the sweeper. Its result: one verdict per criterion
(``criterion``, ``met``, ``evidence``). All met: the turn completes. Some unmet: the agent goes back
to work, told which (the verdicts are a system message in its prompt), at most the profile's
``verification_rounds`` times; after that the turn completes flagged ``criteria_unmet``, with the
verdicts on the turn (timeline, session list, API).

The request: a system message carrying ``VERIFICATION_MARKER`` and the instructions (with the
agent's pinned context), and one user message listing the criteria and the answer.
"""

import json
import logging
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agentops.domain import joins_transaction
from sessions_app.engine import llm
from sessions_app.engine.prompt import system_prompt
from sessions_app.events import event_record
from sessions_app.locks import session_lock
from sessions_app.models import AgentSession, Step, Turn
from sessions_app.services import step_event_payload

log = logging.getLogger(__name__)

VERIFICATION_MARKER = "[[agentops:verification]]"
INSTRUCTIONS = (
    f"{VERIFICATION_MARKER} You check an agent's finished work against the operator's acceptance criteria. "
    "For each criterion decide whether the result meets it, citing the evidence in the result. Answer with one "
    'JSON object and nothing else: {"verdicts": [{"criterion": "<the criterion, verbatim>", "met": true|false, '
    '"evidence": "<why>"}]}, one verdict per criterion, in order.'
)


def verification_request(step: Step) -> tuple[AgentSession, list[dict[str, Any]]]:
    """The session (with its agent) and the messages of a claimed verification step's call."""
    session = AgentSession.objects.select_related("agent").get(pk=step.session_id)
    criteria = "\n".join(f"{i}. {c}" for i, c in enumerate(session.acceptance_criteria, start=1))
    user = f"Acceptance criteria:\n{criteria}\n\nThe turn's result:\n{step.arguments.get('answer', '')}"
    system = f"{INSTRUCTIONS}\n\nThe agent's instructions and pinned context:\n{system_prompt(session)}"
    return session, [{"role": "system", "content": system}, {"role": "user", "content": user}]


def verdicts_parse(text: str, criteria: list[str]) -> list[dict[str, Any]]:
    """One verdict per criterion, in order; a criterion the reply does not judge is unmet."""
    found: dict[str, dict[str, Any]] = {}
    try:
        value = json.loads(text[text.find("{"):text.rfind("}") + 1])
    except (json.JSONDecodeError, ValueError):
        value = {}
    for item in (value.get("verdicts") if isinstance(value, dict) else None) or []:
        if isinstance(item, dict) and isinstance(item.get("criterion"), str):
            found[item["criterion"].strip()] = item
    verdicts = []
    for i, criterion in enumerate(criteria):
        item = found.get(criterion.strip())
        if item is None and len(found) == len(criteria):  # the model paraphrased: take it by position
            item = list(found.values())[i]
        verdicts.append({"criterion": criterion, "met": bool(item and item.get("met") is True),
                         "evidence": str((item or {}).get("evidence") or "The verification gave no verdict.")[:1000]})
    return verdicts


def verification_message(step: Step) -> dict[str, Any]:
    """What the agent is told after a verification found criteria unmet."""
    unmet = [v for v in (step.result or {}).get("verdicts", []) if not v.get("met")]
    lines = "\n".join(f"- {v['criterion']}: {v['evidence']}" for v in unmet)
    return {"role": "system", "content": "Verification: your answer does not meet these acceptance criteria yet:\n"
                                         f"{lines}\nKeep working on them, then answer again."}


@joins_transaction
def verification_record(step: Step, reply: llm.ModelReply) -> bool:
    """Record a claimed verification's verdicts. Only the lease holder's write applies: False when
    the step was settled or re-claimed meanwhile."""
    session_lock(step.session_id)
    criteria = list(AgentSession.objects.values_list("acceptance_criteria", flat=True).get(pk=step.session_id))
    verdicts = verdicts_parse(reply.content, criteria)
    result = {"verdicts": verdicts, "all_met": all(v["met"] for v in verdicts),
              "round": int(step.arguments.get("round", 1))}
    now = timezone.now()
    applied = Step.objects.filter(pk=step.pk, status=Step.Status.RUNNING, lease_owner=step.lease_owner).update(
        status=Step.Status.COMPLETED, result=result, message={"role": "assistant", "content": reply.content},
        prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens, finished_at=now,
        lease_owner="", lease_expires_at=None, updated_at=now)
    if not applied:
        log.info("verification step %s was settled or re-claimed meanwhile; its verdicts are dropped", step.id)
        return False
    step.status, step.result = Step.Status.COMPLETED, result
    AgentSession.objects.filter(pk=step.session_id).update(
        model_calls=F("model_calls") + 1, prompt_tokens=F("prompt_tokens") + reply.prompt_tokens,
        completion_tokens=F("completion_tokens") + reply.completion_tokens)
    Turn.objects.filter(pk=step.turn_id).update(prompt_tokens=F("prompt_tokens") + reply.prompt_tokens,
                                                 completion_tokens=F("completion_tokens") + reply.completion_tokens)
    event_record(session_id=step.session_id, turn_id=step.turn_id, step_id=step.id, type="turn.verified",
                 payload=step_event_payload(step, **result))
    return True


def verification_record_atomic(step: Step, reply: llm.ModelReply) -> bool:
    with transaction.atomic():
        return verification_record(step, reply)
