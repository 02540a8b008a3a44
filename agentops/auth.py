from typing import Any

from django.http import HttpRequest
from ninja.security import HttpBearer, SessionAuth

from agentops.services import api_token_authenticate


class BearerTokenAuth(HttpBearer):
    """`Authorization: Bearer <token>` for integrations (tokens from `manage.py agentops_token`)."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        user = api_token_authenticate(token)
        if user is not None:
            request.user = user  # type: ignore[assignment]
        return user


api_auth = [BearerTokenAuth(), SessionAuth()]  # SessionAuth enforces CSRF
