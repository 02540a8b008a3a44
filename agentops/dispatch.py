"""The one way work is handed to a worker: enqueue a task by name, after commit.

Nothing below the interfaces imports a Celery task: the engine and the approvals send by name
(the routes in settings map each name to its queue), so no layer calls back into ``tasks.py``,
and nothing is enqueued for a write that then rolls back. Outside a transaction the send happens
at once (``on_commit`` runs immediately in autocommit mode).
"""

import logging
import uuid

from django.db import transaction
from kombu.exceptions import OperationalError

from agentops.celery import app

log = logging.getLogger(__name__)

TURN_ADVANCE = "sessions_app.tasks.turn_advance_task"
MODEL_CALL = "sessions_app.tasks.model_call_task"
TOOL_RUN = "sessions_app.tasks.tool_run_task"


def _send_on_commit(task_name: str, object_id: uuid.UUID | str) -> None:
    def send() -> None:
        try:
            app.send_task(task_name, args=[str(object_id)])
        except (OperationalError, OSError):
            # The broker is down: the write is committed and the sweeper re-drives quiet turns.
            log.exception("could not enqueue %s(%s); the recovery sweeper will pick it up", task_name, object_id)

    transaction.on_commit(send)


def tick_enqueue(turn_id: uuid.UUID | str) -> None:
    """Wake the engine for a turn (queue ``engine``)."""
    _send_on_commit(TURN_ADVANCE, turn_id)


def model_call_enqueue(step_id: uuid.UUID | str) -> None:
    """Hand a planned model step to the model workers (queue ``llm``)."""
    _send_on_commit(MODEL_CALL, step_id)


def tool_run_enqueue(step_id: uuid.UUID | str) -> None:
    """Hand an approved tool step to the sandbox workers (queue ``sandbox``)."""
    _send_on_commit(TOOL_RUN, step_id)
