"""The JSON API (django-ninja): /api/, OpenAPI at /api/openapi.json, docs at /api/docs.

Every error leaves in one shape, ``{"code", "message", "details"}`` (``ErrorOut``): domain errors
carry their own code and status; ninja's own refusals are mapped here. The apps' routers are
added in ``agentops/urls.py``: this module imports no app, so an app's ``api.py`` can import
``ErrorOut`` and ``ERRORS`` from here.
"""

import logging
from typing import Any

from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from agentops import errors
from agentops.auth import api_auth
from agentops.domain import DomainError
from agentops.parser import StrictJSONParser
from agentops.renderers import FastJSONRenderer
from agentops.schemas import Out

log = logging.getLogger(__name__)


class ErrorOut(Out):
    code: str
    message: str
    details: dict[str, Any]


# The error responses every operation may give, for the OpenAPI schema (503: the database did not
# answer, agentops.errors).
ERRORS: dict[int, type[ErrorOut]] = dict.fromkeys((400, 401, 403, 404, 409, 413, 422, 429, 503), ErrorOut)

# Codes of ninja's own HttpErrors, by status.
HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "permission_denied", 404: "not_found",
              405: "method_not_allowed", 409: "conflict", 413: "payload_too_large", 422: "invalid_arguments",
              429: "throttled"}

api = NinjaAPI(title="agentops", version="1", auth=api_auth, urls_namespace="api", parser=StrictJSONParser(),
               renderer=FastJSONRenderer())


def error_response(request: HttpRequest, status: int, code: str, message: str,
                   details: dict[str, Any] | None = None) -> HttpResponse:
    return api.create_response(request, {"code": code, "message": message, "details": details or {}},
                               status=status)


@api.exception_handler(DomainError)
def on_domain_error(request: HttpRequest, exc: DomainError) -> HttpResponse:
    return error_response(request, exc.status, exc.code, exc.message, exc.details)


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return error_response(request, 422, "invalid_arguments", "The request does not match the schema.",
                          {"errors": exc.errors})


@api.exception_handler(AuthenticationError)
def on_auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error_response(request, 401, "unauthorized",
                          "Authentication required: a Bearer token or a logged-in session.")


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja refuses a body its JSON parser cannot read as HttpError(400, "Cannot parse request body")
    # raised from the parser's error: a JSONDecodeError or UnicodeDecodeError, or a RecursionError
    # for a body nested too deep; agentops.parser's UnsafeJSON for JSON nothing below can hold.
    if exc.status_code == 400 and exc.__cause__ is not None:
        return error_response(request, 400, "malformed_json", "The request body is not valid JSON.",
                              {"error": str(exc.__cause__)[:300]})
    return error_response(request, exc.status_code, HTTP_CODES.get(exc.status_code, "error"), str(exc.message))


@api.exception_handler(Http404)
def on_not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return error_response(request, 404, "not_found", str(exc) or "Not found.")


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def on_database_unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
    return errors.database_unavailable_response(request, exc)


@api.exception_handler(Exception)
def on_unexpected_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    # A bug: logged with its traceback and signalled like any unhandled error (error reporters and
    # the test client listen); the caller gets the error shape, never a traceback.
    log.exception("unhandled error in %s %s", request.method, request.path)
    got_request_exception.send(sender=None, request=request)
    return error_response(request, 500, "internal_error", "The server failed to handle this request.")
