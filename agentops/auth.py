from typing import Any

from django.http import HttpRequest
from ninja.security import HttpBearer, SessionAuth
from ninja.utils import check_csrf

from agentops.domain import PermissionDenied
from agentops.services import api_token_authenticate


class BearerTokenAuth(HttpBearer):
    """`Authorization: Bearer <token>` for integrations (tokens from `manage.py agentops_token`)."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        user = api_token_authenticate(token)
        if user is not None:
            request.user = user  # type: ignore[assignment]
        return user


class CsrfSessionAuth(SessionAuth):
    """The logged-in browser session, with CSRF enforced on unsafe methods.

    ninja's SessionAuth checks CSRF before it knows whether anyone is logged in, so a request
    with no credentials (or a bad Bearer token) got a CSRF 403 instead of 401. Only a real
    session needs the CSRF check: without one there is nothing a forged request could borrow.
    """

    def _get_key(self, request: HttpRequest) -> str | None:
        if not request.user.is_authenticated:
            return None
        if self.csrf and not getattr(request, "_ninja_csrf_exempt", False) and check_csrf(request):
            raise PermissionDenied("CSRF check failed: send the csrftoken cookie's value in X-CSRFToken.",
                                   code="csrf_failed")
        return request.COOKIES.get(self.param_name)


api_auth = [BearerTokenAuth(), CsrfSessionAuth()]
