"""The JSON API (django-ninja): /api/, OpenAPI at /api/openapi.json, docs at /api/docs."""

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from agentops.auth import api_auth
from agentops.domain import DomainError

api = NinjaAPI(title="agentops", version="1", auth=api_auth, urls_namespace="api")


def _error(request: HttpRequest, status: int, code: str, message: str, details: object = None) -> HttpResponse:
    return api.create_response(request, {"code": code, "message": message, "details": details or {}},
                               status=status)


@api.exception_handler(DomainError)
def on_domain_error(request: HttpRequest, exc: DomainError) -> HttpResponse:
    return _error(request, exc.status, exc.code, exc.message, exc.details)


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    malformed = any(e.get("type") == "json_invalid" for e in exc.errors if isinstance(e, dict))
    if malformed:
        return _error(request, 400, "malformed_json", "The request body is not valid JSON.", {"errors": exc.errors})
    return _error(request, 422, "invalid_arguments", "The request does not match the schema.",
                  {"errors": exc.errors})


@api.exception_handler(AuthenticationError)
def on_auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return _error(request, 401, "unauthorized", "Authentication required: a Bearer token or a logged-in session.")


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja wraps a body its JSON parser refused as HttpError(400, "Cannot parse request body").
    if exc.status_code == 400 and isinstance(exc.__cause__, ValueError):
        return _error(request, 400, "malformed_json", "The request body is not valid JSON.",
                      {"error": str(exc.__cause__)})
    return _error(request, exc.status_code, getattr(exc, "code", "error"), str(exc.message))


def _register_routers() -> None:
    from approvals_app.api import router as approvals_router
    from sessions_app.api import router as sessions_router

    api.add_router("", sessions_router)
    api.add_router("", approvals_router)


_register_routers()
