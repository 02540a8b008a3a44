"""``Idempotency-Key`` on every API POST: the same key and body replay the first response and
cause no second effect; the same key with another body is 422.

The record is inserted first, in the transaction that wraps the request: a concurrent request
with the same key blocks on the unique index until the first commits, then replays it.
"""

import hashlib
from collections.abc import Callable

from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

from agentops.models import IdempotencyRecord


def _scope(request: HttpRequest) -> str:
    who = request.headers.get("Authorization") or request.COOKIES.get("sessionid") or "anonymous"
    return hashlib.sha256(who.encode()).hexdigest()


class IdempotencyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        key = request.headers.get("Idempotency-Key", "")
        if request.method != "POST" or not key or not request.path.startswith("/api/"):
            return self.get_response(request)
        if len(key) > 200:
            return JsonResponse({"code": "invalid_idempotency_key", "message": "Idempotency-Key is over 200 chars.",
                                 "details": {}}, status=422)
        digest = hashlib.sha256(request.path.encode() + b"\n" + request.body).hexdigest()
        scope = _scope(request)
        with transaction.atomic():
            try:
                with transaction.atomic():
                    record = IdempotencyRecord.objects.create(scope=scope, key=key, request_sha256=digest)
            except IntegrityError:
                return self._replay(scope, key, digest)
            response = self.get_response(request)
            # A server error may be retried with the same key; so may a request refused before it ran
            # (401, 403: no credentials, a missing CSRF token or permission): replaying the refusal
            # would make the key useless once the caller fixes that.
            if response.status_code >= 500 or response.status_code in (401, 403):
                transaction.set_rollback(True)
                return response
            record.status_code = response.status_code
            record.content_type = response.get("Content-Type", "application/json")
            record.body = response.content
            record.save(update_fields=["status_code", "content_type", "body"])
            return response

    def _replay(self, scope: str, key: str, digest: str) -> HttpResponse:
        record = IdempotencyRecord.objects.get(scope=scope, key=key)
        if record.request_sha256 != digest:
            return JsonResponse({"code": "idempotency_key_reused",
                                 "message": "This Idempotency-Key was used with another request body.",
                                 "details": {}}, status=422)
        response = HttpResponse(bytes(record.body), status=record.status_code or 200,
                                content_type=record.content_type or "application/json")
        response["Idempotent-Replayed"] = "true"
        return response
