from collections.abc import Callable

from django.conf import settings
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
