"""GET /healthz: the state of the database, Redis and the workers."""

import json
import logging
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from agentops.celery import app
from agentops.dispatch import ENGINE_QUEUE
from agentops.selectors import api_token_user
from tools_app.sandbox import sandbox_status

log = logging.getLogger(__name__)


def _check_database() -> dict[str, Any]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"ok": True, "vendor": connection.vendor}
    except Exception as exc:  # any failure means "down": report it, never raise
        return {"ok": False, "error": str(exc)[:300]}


def _check_redis() -> dict[str, Any]:
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)
        client.ping()
        return {"ok": True}
    except Exception as exc:
        return {"ok": False, "error": str(exc)[:300]}


def _check_workers() -> dict[str, Any]:
    """The Celery workers that answer, and the queues they consume: the product needs one on the
    engine queue (ticks, the sweeper). A ping counted any worker, so /healthz said ok with only
    make run's notifier (queue notify) alive and every turn stalled."""
    try:
        replies = app.control.inspect(timeout=0.7).active_queues() or {}
    except Exception as exc:
        return {"ok": False, "error": str(exc)[:300], "count": 0}
    names = sorted(replies)
    queues = sorted({str(q.get("name")) for consumed in replies.values() for q in consumed or [] if q.get("name")})
    ok = ENGINE_QUEUE in queues
    error = ("no Celery worker answered" if not names else
             f"no Celery worker consumes the {ENGINE_QUEUE} queue (the workers answering consume: "
             f"{', '.join(queues) or 'nothing'})")
    return {"ok": ok, "count": len(names), "names": names, "queues": queues, **({} if ok else {"error": error})}


def _check_gateways() -> dict[str, Any]:
    """The model gateways that said they are alive in the last half minute (their heartbeat keys)."""
    from sessions_app.engine.gateway import HEARTBEAT_KEY

    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)
        states = [json.loads(str(raw, "utf-8")) for key in client.scan_iter(f"{HEARTBEAT_KEY}*", count=100)
                  if isinstance(raw := client.get(key), bytes)]
    except Exception as exc:
        return {"ok": False, "error": str(exc)[:300], "count": 0}
    names = sorted(state["name"] for state in states)
    return {"ok": bool(names), "count": len(names), "names": names,
            "in_flight": sum(int(state.get("in_flight", 0)) for state in states),
            **({} if names else {"error": "no model gateway is running"})}


def _check_sandbox() -> dict[str, Any]:
    try:
        return dict(sandbox_status())
    except Exception as exc:
        return {"ok": False, "error": str(exc)[:300]}


# What "degraded" means: the product cannot run turns without these (the sandbox only limits it).
REQUIRED = ("database", "redis", "workers", "gateways")


def health_checks() -> dict[str, dict[str, Any]]:
    """The state of the database, Redis, the workers and the sandbox; never raises."""
    checks = {"database": _check_database(), "redis": _check_redis()}
    # Workers are reached through Redis: without it the answer is known.
    down = {"ok": False, "error": "redis down"}
    checks["workers"] = _check_workers() if checks["redis"]["ok"] else down
    checks["gateways"] = _check_gateways() if checks["redis"]["ok"] else down
    checks["sandbox"] = _check_sandbox()
    return checks


def _may_see_details(request: HttpRequest) -> bool:
    """Staff (logged in) or any caller with a valid API token: the details name hosts, paths and
    the sandbox's setup, which an anonymous prober (a load balancer) does not need."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        return True
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and bool(token.strip()) and api_token_user(token.strip()) is not None


@require_GET
def healthz_view(request: HttpRequest) -> JsonResponse:
    checks = health_checks()
    failing = [name for name in REQUIRED if not checks[name]["ok"]]
    body: dict[str, Any] = {"status": "ok" if not failing else "degraded"}
    if _may_see_details(request):
        body |= {"failing": failing, "checks": checks}
    response = JsonResponse(body, status=503 if failing else 200)
    if failing:
        # One line that names what is down, instead of Django's "ERROR Service Unavailable" for every
        # probe (a load balancer or `make run` waiting for the worker polls this).
        log.warning("healthz: failing %s", ", ".join(failing))
        response._has_been_logged = True  # type: ignore[attr-defined]
    return response
