import os
from typing import Any

from celery import Celery
from celery.signals import worker_ready

from agentops.runtime import tune_gc

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")

app = Celery("agentops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def _tune_gc(**kwargs: Any) -> None:
    tune_gc()
