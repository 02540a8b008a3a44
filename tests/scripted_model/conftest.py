"""One scripted model per test module, on a thread, reached over real HTTP (no database needed)."""

from collections.abc import Iterator

import pytest
from openai import OpenAI

from scripted_model.server import ScriptedModelServer, start_in_thread


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ScriptedModelServer, str]]:
    server, base_url = start_in_thread()
    yield server, base_url
    server.shutdown()
    server.server_close()


@pytest.fixture
def base_url(server: tuple[ScriptedModelServer, str]) -> str:
    return server[1]


@pytest.fixture
def client(base_url: str) -> OpenAI:
    # No SDK retries: a scripted failure must be observed, not silently retried away.
    return OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=10)
