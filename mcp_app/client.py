"""Talking to one MCP server with the official SDK: list its tools, call one, within a deadline.

A session's call of a stdio server goes to its long-lived server process (``mcp_app.pool``: one
per session and server, in the sandbox with the session's workspace at /workspace); discovery, and
every HTTP call, opens a connection of its own and closes it at the end. Everything is bounded by
one deadline and by the step's cancellation: a slow or hung server is a ``timeout`` failure, a
cancelled step a ``cancelled`` one, never a worker stuck. What went wrong is classified into an
``McpFailure`` with a code the step records.
"""

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pydantic
from mcp import ClientSession, McpError, types
from mcp.client.streamable_http import streamable_http_client

from agentops.domain import canonical_json
from tools_app.sandbox import SandboxUnavailable

from .pool import CallCancelled, StaleServer, call_pool
from .stdio import StdioTrouble, sandboxed_stdio

T = TypeVar("T")


@dataclass(frozen=True)
class ServerConnection:
    """How to reach one server for one operation; secrets already resolved (never stored)."""

    name: str
    transport: str
    timeout: int
    workspace: Path
    command: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    network: str = "none"
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)


class McpFailure(Exception):
    """A call that did not produce a result: ``code`` is the step's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def tool_sha256(tool: types.Tool) -> str:
    """The hash of what a server declares about one tool: a change in any of it is a new version."""
    doc = {"name": tool.name, "description": tool.description or "", "input_schema": tool.inputSchema,
           "output_schema": tool.outputSchema,
           "annotations": tool.annotations.model_dump(exclude_none=True) if tool.annotations else {}}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


@asynccontextmanager
async def _session(conn: ServerConnection, trouble: StdioTrouble, long_lived: bool = False) -> AsyncIterator[
        ClientSession]:
    if conn.transport == "stdio":
        async with sandboxed_stdio(argv=conn.command, workspace=conn.workspace, mounts=conn.mounts, env=conn.env,
                                   network=conn.network, timeout=conn.timeout, trouble=trouble,
                                   long_lived=long_lived) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            yield session
    else:
        timeout = httpx.Timeout(conn.timeout)
        async with httpx.AsyncClient(headers=conn.headers, timeout=timeout, follow_redirects=False) as http, \
                streamable_http_client(conn.url, http_client=http) as (read, write, _sid), \
                ClientSession(read, write) as session:
            await session.initialize()
            yield session


def _run(conn: ServerConnection, body: Callable[[ClientSession], Awaitable[T]], *, session_id: str = "",
         should_cancel: Callable[[], bool] | None = None) -> T:
    """Run ``body`` against the server under the deadline (on the session's kept stdio process
    when ``session_id`` is given); classify every way it can fail."""
    trouble = StdioTrouble()
    try:
        return call_pool().run(conn, body, opener=_session, trouble=trouble, session_id=session_id,
                               should_cancel=should_cancel)
    except McpFailure:
        raise
    except CallCancelled as exc:
        raise McpFailure("cancelled", f"The call to the MCP server {conn.name!r} was cancelled; the server was "
                                      "told to stop it (notifications/cancelled).") from exc
    except TimeoutError as exc:
        raise McpFailure("timeout", f"The MCP server {conn.name!r} did not answer within {conn.timeout} s; "
                                    "the connection was closed.") from exc
    except SandboxUnavailable as exc:
        raise McpFailure("sandbox_error", str(exc)) from exc
    except pydantic.ValidationError as exc:
        raise McpFailure("mcp_malformed_result", f"The MCP server {conn.name!r} sent a malformed reply: "
                                                 f"{_first_error(exc)}") from exc
    except ValueError as exc:  # the server's configuration (env names, sizes), before any I/O
        raise McpFailure("mcp_config_error", f"The MCP server {conn.name!r} is misconfigured: {exc}") from exc
    except McpError as exc:
        raise _from_mcp_error(conn, exc, trouble) from exc
    except (httpx.HTTPError, OSError) as exc:
        raise McpFailure("mcp_unavailable", f"The MCP server {conn.name!r} is unreachable: {exc}") from exc
    except BaseExceptionGroup as group:
        raise _from_group(conn, group, trouble) from group
    except RuntimeError as exc:  # the SDK's own checks (e.g. structured content against the output schema)
        raise McpFailure("mcp_malformed_result", f"The MCP server {conn.name!r}: {exc}") from exc


def _first_error(exc: pydantic.ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return str(exc)[:300]
    first = errors[0]
    return f"{'/'.join(str(p) for p in first.get('loc', ()))}: {first.get('msg', '')}"[:300]


def _from_mcp_error(conn: ServerConnection, exc: McpError, trouble: StdioTrouble) -> McpFailure:
    if trouble.malformed:
        return McpFailure("mcp_malformed_result", f"The MCP server {conn.name!r} wrote something that is not "
                                                  f"JSON-RPC: {trouble.malformed!r}")
    message = exc.error.message if exc.error else str(exc)
    if "closed" in message.lower():
        tail = trouble.stderr_tail()
        return McpFailure("mcp_connection_lost",
                          f"The MCP server {conn.name!r} went away during the call ({message}); whether the call "
                          "took effect is unknown." + (f" Its last error output: {tail[-800:]}" if tail else ""))
    return McpFailure("mcp_error", f"The MCP server {conn.name!r} refused the request: {message}")


def _from_group(conn: ServerConnection, group: BaseExceptionGroup, trouble: StdioTrouble) -> McpFailure:
    """anyio task groups wrap what failed inside them: classify the first meaningful one."""
    for exc in _leaves(group):
        if isinstance(exc, McpFailure):
            return exc
        if isinstance(exc, McpError):
            return _from_mcp_error(conn, exc, trouble)
        if isinstance(exc, pydantic.ValidationError):
            return McpFailure("mcp_malformed_result", f"The MCP server {conn.name!r} sent a malformed reply: "
                                                      f"{_first_error(exc)}")
        if isinstance(exc, TimeoutError):
            return McpFailure("timeout", f"The MCP server {conn.name!r} did not answer within {conn.timeout} s.")
        if isinstance(exc, httpx.HTTPError | OSError):
            return McpFailure("mcp_unavailable", f"The MCP server {conn.name!r} is unreachable: {exc}")
    return McpFailure("mcp_error", f"The MCP server {conn.name!r} failed: {group!r}"[:1000])


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


async def _all_tools(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _page in range(50):  # a server that pages forever is cut off
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.nextCursor
        if not cursor:
            break
    return tools


def list_tools(conn: ServerConnection) -> list[types.Tool]:
    """Every tool the server lists now."""
    return _run(conn, _all_tools)


def call_tool(conn: ServerConnection, *, remote_name: str, arguments: dict[str, Any], expected_sha256: str,
              session_id: str = "", should_cancel: Callable[[], bool] | None = None) -> types.CallToolResult:
    """Call one tool, after checking that the server still declares it as it was discovered (a
    changed tool is refused: what a reviewer approved was the old one)."""

    async def body(session: ClientSession) -> types.CallToolResult:
        listed = {t.name: t for t in await _all_tools(session)}
        tool = listed.get(remote_name)
        if tool is None:
            raise StaleServer(McpFailure("mcp_tool_changed", f"The MCP server {conn.name!r} no longer lists the "
                                                             f"tool {remote_name!r}; the call did not run."))
        if tool_sha256(tool) != expected_sha256:
            raise StaleServer(McpFailure(
                "mcp_tool_changed", f"The MCP server {conn.name!r} changed the tool {remote_name!r} since it was "
                                    "discovered; the call did not run. An admin must refresh the server's tools."))
        return await session.call_tool(remote_name, arguments)

    return _run(conn, body, session_id=session_id, should_cancel=should_cancel)


