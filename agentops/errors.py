"""A database that stopped answering is a 503 the caller may retry, not a 500.

A connection cut under a request (PostgreSQL restarted, its backends terminated, a failover), a
pool with no connection to lend within its timeout, a deadlock or a serialization failure: Django
raises ``OperationalError`` (or ``InterfaceError`` for a connection already closed). Nothing in
the request committed, and the next request takes a fresh connection (the pool drops the broken
one, and ``drop_broken_connections`` checks the others: a server that cut one connection has
cut every idle one, and each would fail a request of its own), so the honest answer is
"unavailable, retry shortly": 503 with ``Retry-After``, in the shape
of the path's API (the house ``{"code", "message", "details"}``, the OpenAI envelope under
``/openai/``, a short page for the dashboard). The chaos proof saw the 500s this replaces when it
terminated every backend.

The two ninja APIs register ``database_unavailable_response`` for these errors; ``server_error``
is Django's ``handler500`` and answers the same for an error raised outside a view (a middleware's
query: the idempotency key, the session, the login), and the house JSON shape for any other
server error under an API path.
"""

import logging
import sys

from django.db import InterfaceError, OperationalError, connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

log = logging.getLogger(__name__)

DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)
RETRY_AFTER_SECONDS = 1
MESSAGE = "The database did not answer (a lost connection or a server restarting); nothing was changed. Retry shortly."
API_PREFIX = "/api/"
WIRE_PREFIX = "/openai/"


def drop_broken_connections() -> None:
    """Hand this thread's broken connection back now (the pool drops it), and check the idle
    connections of each pooled database, dropping the broken ones (psycopg_pool replaces them):
    one round trip per idle connection, on this error path only."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block and not conn.is_usable():
            conn.close()
        pooled = conn.vendor == "postgresql" and conn.settings_dict["OPTIONS"].get("pool")
        pool = getattr(conn, "pool", None) if pooled else None
        if pool is None:
            continue
        try:
            pool.check()
        except Exception as exc:  # the server may still be down: the next request finds out
            log.warning("checking the %s database's pool failed: %s", conn.alias, exc)


def _in_shape_of(request: HttpRequest, status: int, code: str, message: str) -> HttpResponse | None:
    """The error in the shape of ``request``'s API (the OpenAI envelope under /openai/, the house
    shape under /api/); None for a page."""
    if request.path.startswith(WIRE_PREFIX):
        return JsonResponse({"error": {"message": message, "type": "server_error", "code": code, "param": None}},
                            status=status)
    if request.path.startswith(API_PREFIX):
        return JsonResponse({"code": code, "message": message, "details": {}}, status=status)
    return None


def database_unavailable_response(request: HttpRequest, exc: BaseException) -> HttpResponse:
    """503 for ``exc``, one of ``DATABASE_UNAVAILABLE``, in the shape of ``request``'s path."""
    log.warning("database unavailable during %s %s: %s", request.method, request.path, exc)
    drop_broken_connections()
    response = _in_shape_of(request, 503, "database_unavailable", MESSAGE) or HttpResponse(
        "<!doctype html><title>Unavailable</title><h1>The database is not answering</h1>"
        f"<p>{MESSAGE}</p>", status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: called by Django while the error is being handled (``sys.exc_info()``)."""
    exc = sys.exc_info()[1]
    if isinstance(exc, DATABASE_UNAVAILABLE):
        return database_unavailable_response(request, exc)
    return (_in_shape_of(request, 500, "internal_error", "The server failed to handle this request.")
            or defaults.server_error(request))
