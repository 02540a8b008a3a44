"""A total deadline for one outgoing HTTP request: connect, send, headers and the whole body.

httpx's timeouts are per operation (each read may take the whole timeout), so a server that sends
its headers and then one byte before each read timeout holds the calling thread for as long as it
likes. Used by the ``http_request`` tool and by the webhook deliveries (``notify_app``).
"""

import contextlib
import socket
import threading
import time
from typing import Any

import httpx


class Deadline:
    """The deadline of one request. Past it the socket is shut down, which ends any read blocked on
    it; between chunks, ``check`` raises. Arm it by sending with ``send_within`` (or by passing
    ``trace`` as the request's ``trace`` extension); ``cancel`` it when done."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._timers: list[threading.Timer] = []

    def remaining(self) -> float:
        return max(0.001, self.at - time.monotonic())

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: arm the deadline on the socket as soon as it is connected."""
        if event != "connection.connect_tcp.complete":
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            timer = threading.Timer(self.remaining(), self._expire, args=(sock,))
            timer.daemon = True
            self._timers.append(timer)
            timer.start()

    def _expire(self, sock: socket.socket) -> None:
        self.expired = True
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def check(self) -> None:
        if self.expired or time.monotonic() >= self.at:
            self.expired = True
            raise httpx.ReadTimeout("total deadline")

    def cancel(self) -> None:
        for timer in self._timers:
            timer.cancel()


def send_within(client: httpx.Client, request: httpx.Request, deadline: Deadline, *,
                cap: int) -> tuple[httpx.Response, bytes]:
    """Send ``request`` and read its body before ``deadline``: the response (closed) and the body
    read, which stops past ``cap`` bytes (so it may hold up to one chunk more). Make ``client`` with
    ``timeout=deadline.remaining()``, which bounds the connect. Raises ``httpx.HTTPError``; when the
    deadline ended the request, ``deadline.expired`` is true. The caller cancels the deadline."""
    request.extensions["trace"] = deadline.trace
    response = client.send(request, stream=True)
    try:
        received = bytearray()
        for chunk in response.iter_bytes():
            deadline.check()
            received += chunk
            if len(received) > cap:
                break
    finally:
        response.close()
    return response, bytes(received)
