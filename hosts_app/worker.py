"""A hosted sandbox host is a Celery worker started with ``AGENTOPS_SANDBOX_HOST=<name>`` (see
``manage.py sandbox_host``): once ready it registers (pool, labels, capacity, versions, the
sandbox self-test) and heartbeats from a thread until it stops."""

import logging
import platform
import shutil
import subprocess
import threading
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from django.conf import settings
from django.db import close_old_connections

log = logging.getLogger(__name__)
_stop = threading.Event()


def host_facts() -> dict[str, Any]:
    """What the host reports: versions and the sandbox self-test (bubblewrap runs a command)."""
    from tools_app.sandbox import sandbox_status

    bwrap = shutil.which("bwrap")
    bwrap_version = ""
    if bwrap:
        bwrap_version = subprocess.run([bwrap, "--version"], capture_output=True, text=True,
                                       check=False).stdout.strip().removeprefix("bubblewrap ")  # "0.8.0"
    return {"versions": {"python": platform.python_version(), "bubblewrap": bwrap_version,
                         "agentops": "1"},
            "self_test": sandbox_status(refresh=True)}


def _heartbeat_loop(name: str) -> None:
    from hosts_app.services import host_heartbeat, host_register

    facts = host_facts()
    host = None
    while not _stop.is_set():
        try:
            if host is None:
                host = host_register(name=name, pool=settings.AGENTOPS_SANDBOX_HOST_POOL,
                                     labels=list(settings.AGENTOPS_SANDBOX_HOST_LABELS),
                                     capacity=settings.AGENTOPS_SANDBOX_HOST_CAPACITY, **facts)
                log.warning("sandbox host %s registered (pool %s)", name, host.pool)
            else:
                host_heartbeat(host_id=host.id)
        except Exception:  # the database blinked (or the row is gone): register again next beat
            log.exception("sandbox host %s: heartbeat failed", name)
            host = None
        finally:
            close_old_connections()
        _stop.wait(settings.AGENTOPS_HOST_HEARTBEAT_SECONDS)


def _on_ready(**kwargs: Any) -> None:
    name = settings.AGENTOPS_SANDBOX_HOST
    if name:
        threading.Thread(target=_heartbeat_loop, args=(name,), name="host-heartbeat", daemon=True).start()


def _on_shutdown(**kwargs: Any) -> None:
    _stop.set()


def connect_signals() -> None:
    worker_ready.connect(_on_ready, weak=False)
    worker_shutdown.connect(_on_shutdown, weak=False)
