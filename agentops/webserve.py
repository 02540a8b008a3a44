"""Several daphne processes serving one port: the parent opens the listening socket, each daphne
adopts it (``--fd``), and the kernel hands every new connection to one of them.

Why more than one: a daphne process runs Django on one interpreter, so the GIL bounds it to one
core, and a mixed API request costs ~10–20 ms of CPU here (``proof/load.py``: one process answered
~40 requests/s against the 100/s target). WebSockets and SSE streams are spread over the processes
too; each joins the channel layer's groups itself, so every process forwards what it is sent.
"""

import os
import socket
from collections.abc import Sequence

DEFAULT_WEB_PROCESSES = 2
BACKLOG = 1024  # bursts of connections (twisted's default of 50 resets clients)


def web_processes() -> int:
    """``$AGENTOPS_WEB_PROCESSES`` (at least 1), default DEFAULT_WEB_PROCESSES."""
    return max(1, int(os.environ.get("AGENTOPS_WEB_PROCESSES", DEFAULT_WEB_PROCESSES)))


def listen(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """A listening IPv4 TCP socket the daphne children inherit (pass its fileno in ``pass_fds``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def daphne_command(python: str, sock: socket.socket, extra: Sequence[str] = ()) -> list[str]:
    """The command of one daphne process serving ``sock`` (start it with ``pass_fds=(sock.fileno(),)``).
    A WebSocket handshake window wider than daphne's 5 s, which a busy process misses."""
    return [python, "-m", "daphne", "--fd", str(sock.fileno()), "--websocket_connect_timeout", "30", *extra,
            "agentops.asgi:application"]


def announcer_commands(python: str, env: dict[str, str] | None = None) -> dict[str, list[str]]:
    """The announcer processes that push live events to the web processes, by name: one per shard
    of ``$AGENTOPS_ANNOUNCERS`` (in ``env``, else this process's environment; default 1), named
    ``announcer``, ``announcer-2``, …"""
    shards = max(1, int((os.environ if env is None else env).get("AGENTOPS_ANNOUNCERS") or 1))
    return {("announcer" if k == 0 else f"announcer-{k + 1}"): [python, "manage.py", "announcer", "--shard", str(k)]
            for k in range(shards)}
