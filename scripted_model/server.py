"""The HTTP server: routing, authentication, framing; `serve` and `start_in_thread`.

Besides the OpenAI paths it answers `GET /_log`: the request log as a JSON list, `?after=<seq>`
keeping the later entries (see `scripted_model.request_log`). Like every path it needs the API
key when one is set.
"""

import argparse
import hmac
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from scripted_model.demo import DEMO_STATUS_TOKEN_ENV
from scripted_model.planner import (
    ErrorLedger,
    Reply,
    latest_user_text,
    plan_reply,
    prompt_tokens,
    request_purpose,
    system_text,
)
from scripted_model.protocol import (
    MODEL_ID,
    RequestError,
    completion_body,
    error_body,
    model_card,
    stream_chunks,
    validate_request,
)
from scripted_model.request_log import ReplyKind, RequestLog, RequestLogEntry

DEFAULT_PORT = 8765
MAX_BODY_BYTES = 32 * 1024 * 1024


class ScriptedModelServer(ThreadingHTTPServer):
    """Threaded so a slow (`sleep`) or streaming answer never blocks other sessions' calls."""

    daemon_threads = True
    allow_reuse_address = True
    # The stdlib's listen backlog is 5: a thousand sessions calling at once overflow it, dropped
    # connection attempts wait out TCP's SYN retries, and clients time out connecting.
    request_queue_size = 4096

    def __init__(
        self,
        address: tuple[str, int],
        *,
        api_key: str | None = None,
        log_requests: bool = False,
        request_log_path: str | Path | None = None,
        context_window: int | None = None,
    ) -> None:
        self.request_log = RequestLog(path=request_log_path)
        # Prompts estimated above this many tokens (`planner.prompt_tokens`) get OpenAI's 400
        # `context_length_exceeded`; None: no limit.
        self.context_window = context_window
        # A test's provider failure: requests of these purposes (`planner.request_purpose`, e.g.
        # "compaction") are answered with this HTTP status, every time.
        self.refuse_purposes: dict[str, int] = {}
        super().__init__(address, ScriptedModelHandler)
        self.api_key = api_key or None
        self.log_requests = log_requests
        self.ledger = ErrorLedger()
        self._in_flight_lock = threading.Lock()
        self.in_flight = 0  # chat-completions requests being answered now
        self.peak_in_flight = 0

    def call_started(self) -> None:
        with self._in_flight_lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def call_finished(self) -> None:
        with self._in_flight_lock:
            self.in_flight -= 1

    def stats(self) -> dict[str, int]:
        with self._in_flight_lock:
            return {"in_flight": self.in_flight, "peak_in_flight": self.peak_in_flight,
                    "answered": self.request_log.last_seq}

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def logged_requests(self, *, after: int = 0) -> list[RequestLogEntry]:
        """A copy of the request log (entries with seq > `after`); safe to call while serving."""
        return self.request_log.entries(after=after)

    def wait_for_requests(self, count: int, *, after: int = 0, timeout: float = 10.0) -> list[RequestLogEntry]:
        """Wait until `count` chat-completions requests after seq `after` were answered; TimeoutError if not.

        Take `after` from `request_log.last_seq` before acting, when the server is shared."""
        return self.request_log.wait_for(count, after=after, timeout=timeout)

    def server_close(self) -> None:
        super().server_close()
        self.request_log.close()


class ScriptedModelHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps the SDK's pooled connections alive; every response therefore carries a
    # Content-Length or is sent chunked.
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY on each connection: a JSON answer is two writes (headers, then body), and with
    # Nagle's algorithm the body waits for the client's delayed ACK of the headers, ≈ 40 ms on
    # every non-streamed call over a kept-alive connection (found by bench/peers.py).
    disable_nagle_algorithm = True
    server_version = "agentops-scripted-model/1"
    server: ScriptedModelServer

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.log_requests:
            super().log_message(format, *args)

    # ---- routing

    def do_GET(self) -> None:
        path = self._path()
        if path == "/demo/status":
            self._send_demo_status()
            return
        if not self._authorized():
            return
        if path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [model_card(MODEL_ID)]})
        elif path.startswith("/v1/models/"):
            self._send_json(200, model_card(path.removeprefix("/v1/models/")))
        elif path == "/v1/chat/completions":
            self._send_error(405, "Use POST for /v1/chat/completions.")
        elif path == "/_log":
            self._send_log()
        elif path == "/_stats":
            self._send_json(200, self.server.stats())
        else:
            self._send_error(404, f"Unknown path {path}.")

    def do_POST(self) -> None:
        received_at = time.time()
        path = self._path()
        raw = self._read_body()
        if raw is None or not self._authorized():
            return
        if path != "/v1/chat/completions":
            self._send_error(405 if path in ("/v1/models", "/_log") else 404, f"Unknown path {path}.")
            return
        try:
            try:
                decoded = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise RequestError(f"The request body is not valid JSON: {exc}") from exc
            body = validate_request(decoded)
        except RequestError as exc:
            self._send_error(exc.status, exc.message, param=exc.param)
            return
        self._answer(body, received_at)

    def _answer(self, body: dict[str, Any], received_at: float) -> None:
        self.server.call_started()
        try:
            self._answer_now(body, received_at)
        finally:
            self.server.call_finished()

    def _answer_now(self, body: dict[str, Any], received_at: float) -> None:
        window = self.server.context_window
        if window is not None:
            tokens = prompt_tokens(body["messages"])
            if tokens > window:
                self._record(body, None, received_at, "error", 400)
                self._send_json(400, {"error": {
                    "message": f"This model's maximum context length is {window} tokens. However, your messages "
                               f"resulted in {tokens} tokens. Please reduce the length of the messages.",
                    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
                return
        refused = self.server.refuse_purposes.get(request_purpose(body["messages"]))
        if refused is not None:
            self._record(body, None, received_at, "error", refused)
            self._send_error(refused, f"Refused by the test (HTTP {refused}).")
            return
        reply = plan_reply(body["messages"], body.get("tools"))
        if reply.sleep_ms:
            time.sleep(reply.sleep_ms / 1000)
        if reply.error_status is not None and self.server.ledger.first_time(reply.position_key):
            self._record(body, reply, received_at, "error", reply.error_status)
            self._send_error(reply.error_status, f"Scripted failure (HTTP {reply.error_status}); a retry succeeds.",
                             retry_after=reply.retry_after)
            return
        # Recorded before the first byte is sent: a client holding its response finds the entry.
        self._record(body, reply, received_at, "tool_calls" if reply.tool_calls else "text", 200)
        model, created = body["model"], int(time.time())
        if not body.get("stream"):
            self._send_json(200, completion_body(reply, model, created))
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self._send_stream(stream_chunks(reply, model, created, include_usage=include_usage))

    def _record(
        self, body: dict[str, Any], reply: Reply | None, received_at: float, kind: ReplyKind, status: int
    ) -> None:
        messages = body["messages"]
        self.server.request_log.record(
            received_at=received_at,
            model=body["model"],
            message_count=len(messages),
            last_user_message=latest_user_text(messages),
            position=reply.position if reply is not None else 0,
            kind=kind,
            status=status,
            prompt_tokens=prompt_tokens(messages),
            purpose=request_purpose(messages),
            system=system_text(messages),
        )

    def _send_demo_status(self) -> None:
        """The demo's status API: 200 with the payments status for the right bearer token, else 401."""
        expected = os.environ.get(DEMO_STATUS_TOKEN_ENV, "")
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if not expected or scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), expected):
            self._send_json(401, {"error": "a valid bearer token is required"})
            return
        self._send_json(200, {"service": "payments", "status": "degraded", "queue_depth": 1804,
                              "workers": {"payments-worker": "crash-loop backoff (OOMKilled x4)"},
                              "since": "2025-03-14T09:59:52Z"})

    def _send_log(self) -> None:
        after = parse_qs(urlsplit(self.path).query).get("after", ["0"])[-1]
        if not after.isdecimal():
            self._send_error(400, f"'after' must be a sequence number, got {after!r}.", param="after")
            return
        entries = self.server.logged_requests(after=int(after))
        self._send_json(200, [entry.as_json() for entry in entries])

    # ---- plumbing

    def _path(self) -> str:
        path = self.path.split("?", 1)[0]
        return path.rstrip("/") or "/"

    def _read_body(self) -> bytes | None:
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            # Without a length the rest of the stream cannot be framed: answer and drop the connection.
            self.close_connection = True
            self._send_error(
                400 if self.headers.get("Transfer-Encoding") is None else 411, "A Content-Length header is required."
            )
            return None
        length = int(length_header)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._send_error(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.")
            return None
        return self.rfile.read(length)

    def _authorized(self) -> bool:
        expected = self.server.api_key
        if expected is None:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() == "bearer" and key.strip() == expected:
            return True
        self._send_error(401, "Incorrect API key provided.")
        return False

    def _send_error(self, status: int, message: str, *, param: str | None = None,
                    retry_after: int | None = None) -> None:
        headers = {}
        if retry_after is not None:
            headers["retry-after"] = str(retry_after)  # what the script asked for, in seconds
        elif status == 429 or status >= 500:
            # Lets an SDK with retries enabled come back quickly instead of backing off for seconds.
            headers["retry-after-ms"] = "50"
        self._send_json(status, error_body(status, message, param=param), headers)

    def _send_json(
        self, status: int, payload: dict[str, Any] | list[Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status, _reason(status))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send_stream(self, chunks: Iterator[dict[str, Any]]) -> None:
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for item in chunks:
                self._write_chunk(f"data: {json.dumps(item)}\n\n".encode())
            self._write_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # The client went away mid-stream (cancelled turn, timeout): nothing to clean up.
            self.close_connection = True

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        # Flushed per event so a consumer sees each delta as it is produced.
        self.wfile.flush()


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Scripted Error"


# ---------------------------------------------------------------- entry points


def make_server(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    api_key: str | None = None,
    log_requests: bool = False,
    request_log_path: str | Path | None = None,
    context_window: int | None = None,
) -> ScriptedModelServer:
    """Bind the server (port 0 picks a free port) without serving yet."""
    return ScriptedModelServer(
        (host, port),
        api_key=api_key,
        log_requests=log_requests,
        request_log_path=request_log_path,
        context_window=context_window,
    )


def serve(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    api_key: str | None = None,
    *,
    on_ready: Callable[[str], None] | None = None,
    log_requests: bool = True,
    request_log_path: str | Path | None = None,
    context_window: int | None = None,
) -> None:
    """Serve until interrupted. `on_ready` gets the base URL once the port is bound (default: print it)."""
    server = make_server(
        host,
        port,
        api_key=api_key,
        log_requests=log_requests,
        request_log_path=request_log_path,
        context_window=context_window,
    )
    announce = on_ready or (lambda url: print(f"scripted model listening on {url}", flush=True))
    announce(server.base_url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def start_in_thread(
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    api_key: str | None = None,
    request_log_path: str | Path | None = None,
    context_window: int | None = None,
) -> tuple[ScriptedModelServer, str]:
    """Start a server on a background thread for tests; stop it with `server.shutdown()` and
    `server.server_close()`. Returns the server and its base URL (`http://127.0.0.1:N/v1`).
    `server.wait_for_requests(n)` waits for answers instead of sleeping."""
    server = make_server(host, port, api_key=api_key, request_log_path=request_log_path, context_window=context_window)
    thread = threading.Thread(target=server.serve_forever, name="scripted-model", daemon=True)
    thread.start()
    return server, server.base_url


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's options, shared by `python -m scripted_model` and `manage.py scripted_model`
    so the two command lines cannot drift apart."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("SCRIPTED_MODEL_API_KEY") or None,
        help="reject other bearer keys with 401 (default: $SCRIPTED_MODEL_API_KEY; unset accepts any key)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not log each request")
    parser.add_argument(
        "--request-log",
        metavar="PATH",
        default=None,
        help="also append each chat-completions request answered as a JSON line to PATH (GET /_log serves them)",
    )
    parser.add_argument(
        "--context-window",
        type=int,
        metavar="N",
        default=None,
        help="answer prompts estimated above N tokens (characters / 4) with OpenAI's 400 context_length_exceeded",
    )


def serve_from_arguments(options: Mapping[str, Any], *, on_ready: Callable[[str], None] | None = None) -> None:
    """`serve` with the options `add_server_arguments` defined, as argparse's `vars(namespace)` or a
    management command's `options`."""
    serve(
        options["host"],
        options["port"],
        options["api_key"],
        on_ready=on_ready,
        log_requests=not options["quiet"],
        request_log_path=options["request_log"],
        context_window=options.get("context_window"),
    )
