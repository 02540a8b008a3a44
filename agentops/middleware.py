import asyncio
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse

# No inline scripts anywhere: htmx and our own script come from /static/.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith(("/admin/", "/api/docs")):
            response.headers.setdefault("Content-Security-Policy", CSP)
        return response


class RequestSizeLimitMiddleware:
    """413 for bodies over AGENTOPS_MAX_REQUEST_BYTES, before anything reads them."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        limit = settings.AGENTOPS_MAX_REQUEST_BYTES
        if length > limit:
            message = f"The request body is {length} bytes; the limit is {limit}."
            if request.path.startswith("/openai/"):  # the OpenAI Agents API's envelope
                return JsonResponse({"error": {"message": message, "type": "invalid_request_error",
                                               "code": "payload_too_large", "param": None}}, status=413)
            return JsonResponse({"code": "payload_too_large", "message": message, "details": {"limit": limit}},
                                status=413)
        return self.get_response(request)


class NulRefusalMiddleware:
    """400 for a NUL character in the path or the query string: PostgreSQL text refuses NUL, so a
    filter such as ``?q=%00`` was a DataError (500) deep in a query. Django's forms refuse NUL in
    posted fields themselves; the API's JSON parser refuses it in bodies."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path or any("\x00" in key or any("\x00" in v for v in values)
                                         for key, values in request.GET.lists()):
            message = "The URL contains a NUL character."
            if request.path.startswith("/openai/"):  # the wire's own envelope
                return JsonResponse({"error": {"message": message, "type": "invalid_request_error",
                                               "code": "bad_request", "param": None}}, status=400)
            return JsonResponse({"code": "bad_request", "message": message, "details": {}}, status=400)
        return self.get_response(request)


class ApiErrorShapeMiddleware:
    """An API error that never reached the API's handlers (an unknown path under /api/, a method
    the path does not take, a request Django refused first: a Host not in ALLOWED_HOSTS) still
    leaves in the API's ``{"code", "message", "details"}`` shape."""

    CODES = {400: ("bad_request", "The request was refused before it reached the API (a Host header this "
                                  "server does not answer to, or a malformed request)."),
             404: ("not_found", "No such API endpoint."),
             405: ("method_not_allowed", "This endpoint does not take that method.")}

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        shape = self.CODES.get(response.status_code)
        if shape is None or not request.path.startswith(("/api/", "/openai/")) \
                or response.get("Content-Type", "").startswith("application/json"):
            return response
        code, message = shape
        if request.path.startswith("/openai/"):
            shaped = JsonResponse({"error": {"message": message, "type": "invalid_request_error", "code": code,
                                             "param": None}}, status=response.status_code)
        else:
            shaped = JsonResponse({"code": code, "message": message, "details": {}}, status=response.status_code)
        if response.has_header("Allow"):
            shaped["Allow"] = response["Allow"]
        return shaped


class BodyLimitASGI:
    """ASGI wrapper: an HTTP body over AGENTOPS_MAX_REQUEST_BYTES is refused with 413 before the
    application reads it, whether the client declared its length or streams it (chunked).

    Django's ASGI handler reads the whole body (to a spooled file) before any middleware runs,
    so RequestSizeLimitMiddleware alone cannot stop a chunked upload of any size: this reads at
    most the limit plus one chunk, answers 413 past it, and hands the body read so far to the
    application otherwise.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = settings.AGENTOPS_MAX_REQUEST_BYTES
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        try:
            declared_length = int(declared or 0)
        except ValueError:
            declared_length = 0
        if declared_length > limit:
            await _refuse_too_large(send, limit, declared_length, scope)
            return
        messages: list[dict[str, Any]] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect: nobody to answer
                return
            size += len(message.get("body", b""))
            if size > limit:
                await _refuse_too_large(send, limit, size, scope)
                return
            messages.append(message)
            if not message.get("more_body", False):
                break

        async def replay() -> dict[str, Any]:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


class RequestGateASGI:
    """ASGI wrapper: at most ``AGENTOPS_WEB_CONCURRENCY`` HTTP requests of this process in Django
    at once; the others wait here, on the event loop, in arrival order.

    Django's ASGI handler gives every request a thread of its own (a ``ThreadSensitiveContext``
    each), so a burst of N requests made N threads that each took a pooled database connection:
    past the pool's size they waited for one, 30 s, and failed with a 500 (measured: the load
    proof at 100 requests/s for 60 s, 838 PoolTimeout 500s and p50 14 s on two daphnes). Waiting
    here costs a coroutine instead, no request waits for a connection, and fewer threads fight for
    the GIL. A request holds its place until its response starts: a stream (SSE, a download)
    lets go when its headers leave, as its connection does (``StreamReleasesConnectionMiddleware``).
    Long-polls that wait without a connection (``AGENTOPS_WEB_UNGATED_PREFIXES``: the runner's
    job poll) do not take a place. A request whose client goes away while it waits is dropped:
    under overload the process would otherwise still serve, minutes late, every request the
    clients had given up on.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._gate: asyncio.Semaphore | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or str(scope.get("path", "")).startswith(settings.AGENTOPS_WEB_UNGATED_PREFIXES):
            await self.app(scope, receive, send)
            return
        if self._gate is None:  # made on the serving loop
            self._gate = asyncio.Semaphore(settings.AGENTOPS_WEB_CONCURRENCY)
        gate = self._gate
        body: list[dict[str, Any]] = []  # the request's body messages (BodyLimitASGI has them all)
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client is gone
            body.append(message)
            if not message.get("more_body", False):
                break
        if gate.locked():
            admitted = asyncio.ensure_future(gate.acquire())
            gone = asyncio.ensure_future(receive())  # answers only when the client disconnects
            await asyncio.wait({admitted, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not admitted.done():
                admitted.cancel()
                return  # nobody waits for the answer any more
            gone.cancel()
            if gone.done() and not gone.cancelled():  # both at once: the client left all the same
                gate.release()
                return
        else:
            await gate.acquire()
        held = True

        async def receive_after_body() -> dict[str, Any]:
            if body:
                return body.pop(0)
            message: dict[str, Any] = await receive()
            return message

        async def send_releasing(message: dict[str, Any]) -> None:
            nonlocal held
            if held and message["type"] == "http.response.start":
                held = False
                gate.release()
            await send(message)

        try:
            await self.app(scope, receive_after_body, send_releasing)
        finally:
            if held:
                gate.release()


async def _refuse_too_large(send: Any, limit: int, size: int, scope: dict[str, Any]) -> None:
    message = f"The request body is over the limit of {limit} bytes."
    if str(scope.get("path", "")).startswith("/openai/"):  # the wire's own envelope
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                     "code": "payload_too_large", "param": None}}).encode()
    else:
        body = json.dumps({"code": "payload_too_large", "message": message,
                           "details": {"limit": limit, "received_at_least": size}}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
class StreamReleasesConnectionMiddleware:
    """A streaming response (the SSE stream, a download) hands its request's database connection
    back to the pool as soon as the view returned, not when the stream ends.

    Django gives a request's connections back at ``request_finished``, which for a stream comes
    when it closes, minutes later: each open SSE client held one pooled connection, and with as
    many clients as the pool's size every other request of the process waited 30 s and failed
    (found by the chaos proof, issue 13). The stream reads the database in worker threads
    (``database_read``), each taking a connection for the read and giving it back. Outermost in
    MIDDLEWARE: every other middleware is done with the database by then.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.streaming:
            for connection in connections.all(initialized_only=True):
                if not connection.in_atomic_block:  # a test's transaction stays open
                    connection.close()
        return response
