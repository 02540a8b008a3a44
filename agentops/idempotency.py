"""``Idempotency-Key`` on every API POST: the same key and body replay the first response and
cause no second effect; the same key with another body is 422.

The house rule, no work inside a transaction we hold: the key is reserved in one short
transaction (a row with no response yet), the view runs outside it (the services own their
transactions, and no row lock outlives them while the response renders), and the response is
recorded in another short one. A concurrent request with the same key finds the reservation: it
waits up to IN_PROGRESS_WAIT_SECONDS for the first to finish and replays its response, else gets
409 ``idempotency_in_progress``. A request refused before it ran (401, 403) or failed (5xx)
releases its key: the caller may retry with it once that is fixed.

Only an authenticated caller reserves a key (the API refuses everyone else with 401 anyway), and
a key belongs to the credentials it came with: the same key from another caller is another key.
"""

import hashlib
import time
from collections.abc import Callable
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme

from agentops.models import IdempotencyRecord
from agentops.selectors import api_token_user

MAX_KEY_CHARS = 200
IN_PROGRESS_WAIT_SECONDS = 2.0
POLL_SECONDS = 0.05
# A reservation this old belongs to a request whose process died: the key is free again.
STALE_AFTER = timedelta(minutes=10)


# The OpenAI Agents API (``openai_api``) takes keys too, with its own error envelope, and remembers
# only successes: its SDK retries a 400 "Unknown pending tool call" with the same key, and must
# then reach the endpoint again rather than get the first refusal replayed.
WIRE_PREFIX = "/openai/"
# A dashboard form's key (agentops.templatetags): a field, as a page's form sends no headers.
SUBMISSION_FIELD = "submission_key"
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
REDIRECT = "redirect"  # the content type of a remembered page post: its body is the Location


def _error(status: int, code: str, message: str, path: str = "") -> JsonResponse:
    if path.startswith(WIRE_PREFIX):
        response = JsonResponse({"error": {"message": message, "type": "invalid_request_error", "code": code,
                                           "param": None}}, status=status)
        if status == 409:
            response["x-should-retry"] = "true"  # the first request is still running: retrying is right
        return response
    return JsonResponse({"code": code, "message": message, "details": {}}, status=status)


def _scope(request: HttpRequest) -> str | None:
    """Whose key this is: a hash of the credentials the API will authenticate the request with
    (a valid Bearer token first, as ``agentops.auth`` does, else the logged-in session); None
    for a request the API will refuse with 401."""
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip() and api_token_user(token.strip()) is not None:
        return hashlib.sha256(authorization.encode()).hexdigest()
    if request.user.is_authenticated and request.COOKIES.get("sessionid"):
        return hashlib.sha256(request.COOKIES["sessionid"].encode()).hexdigest()
    return None


def _wait(seconds: float) -> None:
    time.sleep(seconds)


class IdempotencyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method != "POST":
            return self.get_response(request)
        if not request.path.startswith(("/api/", WIRE_PREFIX)):
            return self._page_post(request)
        key = request.headers.get("Idempotency-Key", "")
        if not key:
            return self.get_response(request)
        if len(key) > MAX_KEY_CHARS:
            return _error(422, "invalid_idempotency_key", f"Idempotency-Key is over {MAX_KEY_CHARS} chars.",
                          request.path)
        scope = _scope(request)
        if scope is None:
            return self.get_response(request)  # the API answers 401; there is nothing to remember
        digest = hashlib.sha256(request.path.encode() + b"\n" + request.body).hexdigest()
        reserved = self._reserve(scope, key, digest, request.path)
        if isinstance(reserved, HttpResponse):
            return reserved
        response = self._respond(request, reserved)
        # A server error may be retried with the same key; so may a request refused before it ran
        # (401, 403: no credentials, a missing CSRF token or permission): replaying the refusal
        # would make the key useless once the caller fixes that.
        wire_refusal = request.path.startswith(WIRE_PREFIX) and response.status_code >= 300
        if response.status_code >= 500 or response.status_code in (401, 403) or response.streaming or wire_refusal:
            self._release(reserved)
            return response
        reserved.status_code = response.status_code
        reserved.content_type = response.get("Content-Type", "application/json")
        reserved.body = response.content
        reserved.save(update_fields=["status_code", "content_type", "body"])
        return response

    def _page_post(self, request: HttpRequest) -> HttpResponse:
        """A dashboard form that carries a ``submission_key`` (``{% submission_key %}``, a new one
        each time the form is rendered) does its work once: a second post of it (a double click,
        a reload of the result, Back and submit again) is sent where the first one's redirect
        went, once that finished. Only a redirect (the form's success) is remembered: a form sent
        back with errors may be corrected and posted again with the same key."""
        key = request.POST.get(SUBMISSION_FIELD, "") if request.content_type in FORM_TYPES else ""
        scope = _scope(request) if key and len(key) <= MAX_KEY_CHARS else None
        if scope is None:
            return self.get_response(request)
        digest = hashlib.sha256(b"page\n" + request.path.encode()).hexdigest()
        reserved = self._reserve(scope, key, digest, request.path)
        if isinstance(reserved, HttpResponse):
            if reserved.status_code == 409:  # the first post still runs after the wait: back where it came from
                referer = request.META.get("HTTP_REFERER", "")
                same_site = url_has_allowed_host_and_scheme(referer, {request.get_host()}, request.is_secure())
                return HttpResponseRedirect(referer if referer and same_site else "/")
            return reserved
        response = self._respond(request, reserved)
        if response.status_code not in (302, 303) or not response.has_header("Location"):
            self._release(reserved)
            return response
        reserved.status_code, reserved.content_type = response.status_code, REDIRECT
        reserved.body = response["Location"].encode()
        reserved.save(update_fields=["status_code", "content_type", "body"])
        return response

    def _respond(self, request: HttpRequest, reserved: IdempotencyRecord) -> HttpResponse:
        """The view's response under a reservation; an exception frees the key."""
        try:
            return self.get_response(request)
        except BaseException:
            self._release(reserved)
            raise

    def _reserve(self, scope: str, key: str, digest: str, path: str) -> IdempotencyRecord | HttpResponse:
        """The new reservation of the key, or the answer for a key already taken."""
        deadline = time.monotonic() + IN_PROGRESS_WAIT_SECONDS
        while True:
            try:
                with transaction.atomic():
                    return IdempotencyRecord.objects.create(scope=scope, key=key, request_sha256=digest)
            except IntegrityError:
                pass
            record = IdempotencyRecord.objects.filter(scope=scope, key=key).first()
            if record is not None:
                if record.request_sha256 != digest:
                    return _error(422, "idempotency_key_reused",
                                  "This Idempotency-Key was used with another request body.", path)
                if record.status_code is not None:
                    return self._replay(record)
                if record.created_at < timezone.now() - STALE_AFTER:
                    IdempotencyRecord.objects.filter(pk=record.pk, status_code__isnull=True).delete()
                    continue
            # Reserved by a request still running (or released a moment ago: try again).
            if time.monotonic() >= deadline:
                return _error(409, "idempotency_in_progress",
                              "A request with this Idempotency-Key is still running; retry shortly.", path)
            if record is not None:
                _wait(POLL_SECONDS)

    def _release(self, record: IdempotencyRecord) -> None:
        IdempotencyRecord.objects.filter(pk=record.pk, status_code__isnull=True).delete()

    def _replay(self, record: IdempotencyRecord) -> HttpResponse:
        if record.content_type == REDIRECT:
            redirect = HttpResponseRedirect(bytes(record.body).decode())
            redirect["Idempotent-Replayed"] = "true"
            return redirect
        response = HttpResponse(bytes(record.body), status=record.status_code or 200,
                                content_type=record.content_type or "application/json")
        response["Idempotent-Replayed"] = "true"
        return response
