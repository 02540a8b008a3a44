"""Helpers for WebSocket consumer tests (Channels' WebsocketCommunicator)."""

from collections.abc import AsyncIterator

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client


@pytest.fixture(autouse=True)
async def close_thread_connections() -> AsyncIterator[None]:
    """Import into a consumer test module: it closes the ORM's connection in asgiref's thread."""
    yield
    # The ORM ran in asgiref's sync thread; its kept-alive connection would block dropping the test database.
    await database_sync_to_async(connections.close_all)()


@database_sync_to_async
def cookie_for(user: User) -> bytes:
    """The Cookie header of a logged-in browser of ``user``."""
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()
