from collections.abc import Callable

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
            return JsonResponse({"code": "payload_too_large",
                                 "message": f"The request body is {length} bytes; the limit is {limit}.",
                                 "details": {"limit": limit}}, status=413)
        return self.get_response(request)


class ApiErrorShapeMiddleware:
    """An API error that never reached the API's handlers (an unknown path under /api/, a method
    the path does not take) still leaves in the API's ``{"code", "message", "details"}`` shape."""

    CODES = {404: ("not_found", "No such API endpoint."),
             405: ("method_not_allowed", "This endpoint does not take that method.")}

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        shape = self.CODES.get(response.status_code)
        if shape is None or not request.path.startswith("/api/") \
                or response.get("Content-Type", "").startswith("application/json"):
            return response
        code, message = shape
        shaped = JsonResponse({"code": code, "message": message, "details": {}}, status=response.status_code)
        if response.has_header("Allow"):
            shaped["Allow"] = response["Allow"]
        return shaped


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
