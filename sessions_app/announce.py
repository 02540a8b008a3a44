"""Announce stored events on the channel layer, after commit, without ever failing the write.

``async_to_sync(group_send)`` builds an event loop and a Redis connection per call (≈ 4 ms);
one persistent loop in a daemon thread keeps the connection pool warm (≈ 1 ms per send).
"""

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

ANNOUNCE_TIMEOUT_SECONDS = 2.0

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()

# Renders the HTML fragment of an event for the dashboard; set by the dashboard (views layer)
# so this module does not import templates it does not own. Rendered once, by the sender.
fragment_renderer: Callable[[dict[str, Any]], str] | None = None


def _get_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="event-announcer", daemon=True).start()
            _loop = loop
        return _loop


def session_group(session_id: object) -> str:
    return f"session.{session_id}"


APPROVALS_GROUP = "approvals"


async def _send_all(messages: list[tuple[str, dict[str, Any]]]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    for group, message in messages:
        await layer.group_send(group, message)


def announce_event(event: dict[str, Any]) -> bool:
    """Send one stored event to its session group (and approvals group). Never raises.

    Returns False when the announcement failed; the event is stored regardless and clients
    recover it from the database by ``seq``.
    """
    html = ""
    if fragment_renderer is not None:
        try:
            html = fragment_renderer(event)
        except Exception:
            log.exception("rendering the fragment of event %s failed", event.get("seq"))
    message = {"type": "event.message", "event": event, "html": html}
    messages = [(session_group(event["session_id"]), message)]
    if str(event["type"]).startswith("approval."):
        messages.append((APPROVALS_GROUP, message))
    future = asyncio.run_coroutine_threadsafe(_send_all(messages), _get_loop())
    try:
        future.result(timeout=ANNOUNCE_TIMEOUT_SECONDS)
        return True
    except Exception as exc:
        future.cancel()  # Redis down or slow: the event is stored; say so and go on
        log.warning("announcing event %s/%s failed: %s", event.get("session_id"), event.get("seq"), exc)
        return False
