"""A session's events on the wire: ``data:``-only Server-Sent Events frames.

The SDK's decoder never resets its last event id, so one ``id:`` line would turn every later
blank line into an empty event it cannot parse: frames carry ``data:`` only, and keepalives are
comment lines. The first bytes (a comment) leave at once: the SDK's ``sessions.stream`` waits for
the response's headers before it posts the input that makes the first event.
"""

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from uuid import UUID

from openai_api.wire import WireStream
from sessions_app.streams import Recheck, StreamEnd, session_events


def data_frame(event: dict[str, object]) -> str:
    return f"data: {json.dumps(event, separators=(',', ':'), default=str)}\n\n"


async def wire_event_stream(session_id: UUID, after: int, stream: WireStream, *,
                            max_seconds: float | None = None, recheck: Recheck | None = None,
                            recheck_seconds: float = 30.0) -> AsyncGenerator[str, None]:
    """The session's events after seq ``after``, translated by ``stream``, then live ones; ends when
    ``recheck()`` says the client may no longer watch (a revoked token, a removed membership).
    The wire has no reconnect event, so no maximum life: the SDK's stream ends with its session."""
    async with aclosing(session_events(session_id, after, max_seconds=max_seconds, recheck=recheck,
                                       recheck_seconds=recheck_seconds)) as events:
        async for event in events:
            if event is None:
                yield ": ok\n\n"
                continue
            if isinstance(event, StreamEnd):
                return
            for wire_event in stream.translate(event):
                yield data_frame(wire_event)
