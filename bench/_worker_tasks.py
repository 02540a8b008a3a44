"""A no-op Celery task for the benchmarks' floor, loaded into the bench worker with ``--include``.

It does what the engine does last in every hop: announce one event on the channel layer (the
same ``announce_event``, after which the benchmark's listener sees it), and nothing else.
"""

from celery import shared_task


@shared_task(name="bench.ping", ignore_result=True)
def ping(session_id: str, token: str) -> None:
    from django.utils import timezone

    from sessions_app import announce

    announce.announce_event({"seq": 0, "type": "bench.ping", "session_id": session_id, "turn_id": None,
                             "step_id": None, "payload": {"token": token},
                             "created_at": timezone.now().isoformat()})
