"""Clients for tests: the API with a Bearer token, a logged-in browser, a WebSocket."""

from typing import Any

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from agentops.services import api_token_create


def api_token(user: User) -> str:
    """A new API token of ``user``."""
    return api_token_create(username=user.username)[1]


def api_client(user: User, **client_kwargs: Any) -> Client:
    """A test client that authenticates every request with a Bearer token of ``user``."""
    return Client(headers={"Authorization": f"Bearer {api_token(user)}"}, **client_kwargs)


def login(user: User) -> Client:
    """A test client logged in as ``user`` (a browser session)."""
    client = Client()
    client.force_login(user)
    return client


@database_sync_to_async
def cookie_for(user: User) -> bytes:
    """The Cookie header of a logged-in browser of ``user``."""
    return f"sessionid={login(user).cookies['sessionid'].value}".encode()


async def ws_communicator(path: str, user: User | None) -> WebsocketCommunicator:
    """A WebSocket client of the ASGI application, from our origin, logged in as ``user`` (or anonymous)."""
    from agentops.asgi import application

    headers = [(b"origin", b"http://testserver")]
    if user is not None:
        headers.append((b"cookie", await cookie_for(user)))
    return WebsocketCommunicator(application, path, headers=headers)
