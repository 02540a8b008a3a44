"""Several daphne processes serving one port: the parent opens the listening socket, each daphne
adopts it (``--fd``), and the kernel hands every new connection to one of them.

Why more than one: a daphne process runs Django on one interpreter, so the GIL bounds it to one
core, and a mixed API request costs ~10–20 ms of CPU here (``proof/load.py``: one process answered
~40 requests/s against the 100/s target). WebSockets and SSE streams are spread over the processes
too; each joins the channel layer's groups itself, so every process forwards what it is sent.

``make run`` starts its daphnes so; a web host of the multi-host layout runs
``python -m agentops.webserve --host 0.0.0.0 --port 8000 --processes 2`` (``main`` below): plain
``daphne -e tcp:port=8000`` binds the port itself, so a second one on the host fails with
"Address already in use". The parent restarts a daphne that exits (the others keep serving the
port meanwhile), gives up when one keeps dying at its start (a setting is wrong: its output says
which), and stops them all on SIGTERM or SIGINT.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
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


EARLY_EXIT_SECONDS = 5.0  # a daphne that exits this soon after its start failed to start
EARLY_EXITS_TO_GIVE_UP = 3  # in a row: then the parent stops (and its service manager may restart it)


def serve(host: str, port: int, processes: int, extra: Sequence[str] = (), python: str = sys.executable) -> int:
    """Serve ``host:port`` with ``processes`` daphnes until SIGTERM or SIGINT (exit status 0), or
    until daphnes keep exiting at their start (1). 2: the port cannot be listened on."""
    try:
        sock = listen(host, port)
    except OSError as exc:
        print(f"agentops.webserve: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    stopping: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: stopping.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    children: list[tuple[subprocess.Popen[bytes], float]] = []
    early_exits, status = 0, 0

    def start() -> tuple[subprocess.Popen[bytes], float]:
        return subprocess.Popen(daphne_command(python, sock, extra), pass_fds=(sock.fileno(),)), time.monotonic()

    try:
        children = [start() for _ in range(processes)]
        print(f"agentops.webserve: serving http://{host}:{port}/ with {processes} daphne processes "
              f"(pids {', '.join(str(proc.pid) for proc, _ in children)})", flush=True)
        while not stopping:
            for i, (proc, started) in enumerate(children):
                code = proc.poll()
                if code is None:
                    continue
                ran = time.monotonic() - started
                early_exits = early_exits + 1 if ran < EARLY_EXIT_SECONDS else 0
                if early_exits >= EARLY_EXITS_TO_GIVE_UP:
                    print(f"agentops.webserve: daphne exited with {code} within {EARLY_EXIT_SECONDS:.0f} s of its "
                          f"start {early_exits} times in a row; stopping (its output above says why)", file=sys.stderr)
                    stopping.append(0)
                    status = 1
                    break
                print(f"agentops.webserve: daphne {proc.pid} exited with {code} after {ran:.1f} s; starting "
                      "another", file=sys.stderr, flush=True)
                children[i] = start()
            time.sleep(0.2)
    finally:
        _stop([proc for proc, _ in children])
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status


def _stop(procs: list[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentops.webserve",
        description="Serve agentops on one port with several daphne processes (one core each).",
        epilog="Arguments after -- go to each daphne (e.g. -- --proxy-headers).")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (IPv4; default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="default 8000")
    parser.add_argument("--processes", type=positive_int, default=None,
                        help=f"daphne processes (default $AGENTOPS_WEB_PROCESSES, else {DEFAULT_WEB_PROCESSES})")
    own = list(sys.argv[1:] if argv is None else argv)
    extra = own[own.index("--") + 1:] if "--" in own else []
    args = parser.parse_args(own[:own.index("--")] if "--" in own else own)
    return serve(args.host, args.port, args.processes or web_processes(), extra)


if __name__ == "__main__":
    sys.exit(main())
