"""An MCP server for the tests, standalone (only the ``mcp`` package), over stdio or streamable HTTP.

``note``'s text picks a misbehaviour: ``__slow__`` waits 30 s (noted in ``started.log``; a
cancelled wait is written to ``cancelled.log``), ``__stuck__`` blocks its process 30 s (ignores
cancellation), ``__malformed__`` writes a line that is not JSON-RPC, ``__crash__`` kills the
process after its effect. The flag file ``schema_v2`` in ``MCP_FIXTURE_FLAGS`` (read at start-up:
a kept stdio server sees it once restarted) makes ``note`` gain a ``priority``. ``whoami`` names
the process (``boot``: random at start-up), so a test can tell a kept process from a new one.
``note`` appends to ``notes.log`` in ``MCP_FIXTURE_NOTES`` (default: /workspace, the session's
workspace in the sandbox): the effect the exactly-once tests count.
"""

import base64
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ImageContent, TextContent, ToolAnnotations

BOOT = uuid.uuid4().hex
FLAGS = Path(os.environ.get("MCP_FIXTURE_FLAGS", "."))
NOTES = Path(os.environ.get("MCP_FIXTURE_NOTES", "/workspace"))
# A 1×1 PNG.
PIXEL = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGA"
                         "hKmMIQAAAABJRU5ErkJggg==")

server = FastMCP("fixture", host="127.0.0.1", port=int(os.environ.get("MCP_FIXTURE_PORT", "0") or 0))


def _flag(name: str) -> bool:
    return (FLAGS / name).exists()


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def lookup(key: str) -> dict[str, Any]:
    """Look a key up (read-only; returns structured content)."""
    return {"key": key, "value": key.upper()}


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def whoami(ctx: Context) -> dict[str, Any]:
    """Where the server runs: its working directory, the FIXTURE_TOKEN it was given and (over HTTP)
    the Authorization header it was sent (a careless server that echoes its credentials)."""
    request = getattr(ctx.request_context, "request", None)
    auth = request.headers.get("authorization", "") if request is not None else ""
    return {"cwd": os.getcwd(), "home": os.environ.get("HOME", ""), "token": os.environ.get("FIXTURE_TOKEN", ""),
            "uid": os.getuid(), "boot": BOOT, "auth": auth}


@server.tool()
def snapshot() -> list[Any]:
    """A picture and a caption."""
    return [TextContent(type="text", text="a pixel"),
            ImageContent(type="image", data=base64.b64encode(PIXEL).decode(), mimeType="image/png")]


if _flag("schema_v2"):
    @server.tool(name="note")
    async def note_v2(text: str, priority: int = 1) -> str:
        """Append a note with a priority (changes state)."""
        return await _note(f"{priority}:{text}")
else:
    @server.tool(name="note")
    async def note_v1(text: str) -> str:
        """Append a note (changes state)."""
        return await _note(text)


async def _note(text: str) -> str:
    if text.endswith("__slow__"):
        with (NOTES / "started.log").open("a") as log:
            log.write(text + "\n")
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            with (NOTES / "cancelled.log").open("a") as log:
                log.write(text + "\n")
            raise
    if text.endswith("__stuck__"):
        time.sleep(30)
    if text.endswith("__malformed__"):
        sys.stdout.write("this is not json-rpc\n")
        sys.stdout.flush()
        time.sleep(30)
    with (NOTES / "notes.log").open("a") as log:
        log.write(text + "\n")
    if text.endswith("__crash__"):
        os._exit(9)  # after the effect: whether the call took effect is unknown to the caller
    return f"noted: {text}"


if __name__ == "__main__":
    server.run("streamable-http" if "--http" in sys.argv else "stdio")
