import os
from typing import Any

from celery import Celery
from celery.signals import worker_ready

from agentops.runtime import tune_gc

# Whether the caller chose the settings: a command run by agentops.embedded_redis (pytest) must
# not inherit the default set here, which would override pytest's own (agentops.demo_settings).
SETTINGS_MODULE_GIVEN = "DJANGO_SETTINGS_MODULE" in os.environ
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")

app = Celery("agentops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def _tune_gc(**kwargs: Any) -> None:
    tune_gc()
