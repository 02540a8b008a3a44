"""A slow webhook receiver does not slow the engine: deliveries run on the ``notify`` queue, on a
worker of their own (make run's "notifier"), never on the threads that tick turns. Real processes
as make run lays them out: a Celery worker on engine and sandbox, one on notify, a model gateway;
a real receiver that drips its answers (an outside audit: an approved command stayed
awaiting_approval for 102 s+ while 8 deliveries to such a receiver held the engine's threads)."""

import json

from django.contrib.auth.models import User

from approvals_app.services import approval_decide
from notify_app.models import Delivery, WebhookEndpoint
from sessions_app.engine.commands import session_start
from sessions_app.models import AgentProfile, Event
from tests.helpers import WorkerFactory, finished, pending_approvals
from tests.notify_app.drip import DripReceiver
from tests.waiting import wait_for
from tools_app.models import ToolDefinition


def test_a_dripping_webhook_receiver_does_not_delay_an_approved_command(
        worker_process: WorkerFactory, engine_agent: AgentProfile, operator: User, reviewer: User) -> None:
    drip = DripReceiver(interval=0.5, give_up_after=120)
    try:
        for n in range(12):  # one team's 12 endpoints, all at the same slow receiver
            WebhookEndpoint.objects.create(team=engine_agent.team, name=f"drip {n}", url=drip.url, secret="s")
        ToolDefinition.objects.filter(name="run_command").update(timeout_seconds=10)
        # Each attempt may hold its thread for a minute: far longer than this test waits.
        slow = {"AGENTOPS_NOTIFY_TIMEOUT_SECONDS": "60"}
        worker_process(kind="gateway")
        worker_process(extra_env=slow)  # engine and sandbox, 4 threads
        worker_process(queues="notify", concurrency=2, extra_env=slow)
        session, turn = session_start(agent=engine_agent, owner=operator,
                                       input=f"tool run_command {json.dumps({'command': 'echo ran'})}\nsay {{results}}")
        assert turn is not None
        (approval,) = pending_approvals(turn, 1, timeout=60)
        assert Delivery.objects.filter(request_id=approval.request_id, channel="webhook").count() == 12
        wait_for(lambda: drip.open >= 2, 30, "deliveries held by the dripping receiver")
        approval_decide(request_id=approval.request_id, actor=reviewer, decision="approve",
                        seen_hash=approval.arguments_sha256)
        started = Event.objects.filter(session=session, step_id=approval.step_id, type="tool.started")
        wait_for(started.exists, 20, "the approved command to start")  # took 0.3-2.8 s here
        assert drip.open >= 2  # the receiver still holds the notifier's threads
        turn = finished(turn, 60)
        assert turn.status == "completed", (turn.error_code, turn.error_message)
    finally:
        drip.close()
