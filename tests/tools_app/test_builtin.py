import hashlib
import http.server
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools_app.builtin import BUILTIN_TOOLS, execute_tool, validate_arguments, write_file_preview
from tools_app.sandbox import sandbox_ids, workspace_for


@pytest.fixture
def workspace() -> Path:
    return workspace_for("builtin-session")


def test_every_builtin_has_a_valid_schema_and_defaults() -> None:
    assert set(BUILTIN_TOOLS) == {"list_files", "read_file", "write_file", "run_command", "publish_artifact",
                                  "send_email", "http_request", "search_flights", "hold_seats", "rebook_passengers"}
    for tool in BUILTIN_TOOLS.values():
        assert tool.parameters_schema["type"] == "object"
        assert tool.approval_mode in ("safe_readonly", "confirm_once", "mutating")
        assert tool.network in ("none", "host") and tool.timeout_seconds > 0
    assert not BUILTIN_TOOLS["list_files"].needs_sandbox and not BUILTIN_TOOLS["read_file"].needs_sandbox
    assert BUILTIN_TOOLS["run_command"].needs_sandbox and BUILTIN_TOOLS["run_command"].approval_mode == "mutating"


def test_validate_arguments_lists_every_error() -> None:
    schema = BUILTIN_TOOLS["write_file"].parameters_schema
    assert validate_arguments("write_file", schema, {"path": "a", "content": "b"}) == []
    errors = validate_arguments("write_file", schema, {"path": 3, "extra": 1})
    assert len(errors) == 3 and any("content" in error for error in errors)


def test_write_file_creates_returns_the_diff_and_leaves_it_editable_by_the_sandbox(workspace: Path) -> None:
    result = execute_tool(name="write_file", workspace=workspace, arguments={"path": "src/a.py", "content": "x = 1\n"})
    assert result.status == "completed" and result.files_changed["created"] == ["src/a.py"]
    assert "+++ b/src/a.py" in result.output and "+x = 1" in result.output
    assert (workspace / "src" / "a.py").stat().st_uid == sandbox_ids()[0]
    assert (workspace / "src").stat().st_uid == sandbox_ids()[0]
    preview = write_file_preview(workspace, {"path": "src/a.py", "content": "x = 2\n"})
    assert "-x = 1" in preview and "+x = 2" in preview
    assert (workspace / "src" / "a.py").read_text() == "x = 1\n"  # the preview wrote nothing
    result = execute_tool(name="write_file", workspace=workspace, arguments={"path": "src/a.py", "content": "x = 2\n"})
    assert result.files_changed["modified"] == ["src/a.py"] and result.output == preview
    assert write_file_preview(workspace, {"path": "../a", "content": ""}).startswith("(cannot preview: denied")


def test_write_file_does_not_write_through_a_symlink(workspace: Path) -> None:
    """An audit linked notes.txt to .local/…/usercustomize.py with a command, then write_file
    notes.txt: the reviewer's diff and the result said notes.txt, the code went into the target."""
    hook = workspace / ".local" / "usercustomize.py"
    hook.parent.mkdir()
    hook.write_text("# empty\n")
    os.symlink(".local/usercustomize.py", workspace / "notes.txt")
    os.symlink(".local", workspace / "docs")
    arguments = {"path": "notes.txt", "content": "import os\n"}
    preview = write_file_preview(workspace, arguments)
    assert preview.startswith("(cannot preview:") and "'.local/usercustomize.py'" in preview
    result = execute_tool(name="write_file", workspace=workspace, arguments=arguments)
    assert result.error_code == "denied" and "does not follow symlinks" in result.output, result
    through_dir = execute_tool(name="write_file", workspace=workspace,
                               arguments={"path": "docs/usercustomize.py", "content": "import os\n"})
    assert through_dir.error_code == "denied"
    assert hook.read_text() == "# empty\n"
    direct = execute_tool(name="write_file", workspace=workspace,
                          arguments={"path": ".local/usercustomize.py", "content": "x = 1\n"})
    assert direct.status == "completed" and hook.read_text() == "x = 1\n"


def test_read_file_caps_the_size_and_refuses_special_files(workspace: Path) -> None:
    (workspace / "big.txt").write_text("a" * 5000)
    result = execute_tool(name="read_file", workspace=workspace, arguments={"path": "big.txt", "max_bytes": 100})
    assert result.output.startswith("a" * 100) and result.data["truncated"] and result.data["size"] == 5000
    os.mkfifo(workspace / "fifo")
    assert execute_tool(name="read_file", workspace=workspace, arguments={"path": "fifo"}).error_code == \
        "invalid_arguments"
    missing = execute_tool(name="read_file", workspace=workspace, arguments={"path": "nope.txt"})
    assert missing.error_code == "invalid_arguments"
    os.symlink("big.txt", workspace / "inside-link")  # a symlink that stays inside is fine
    assert execute_tool(name="read_file", workspace=workspace,
                        arguments={"path": "/workspace/inside-link"}).data["size"] == 5000


def test_list_files(workspace: Path) -> None:
    (workspace / "d").mkdir()
    (workspace / "d" / "f.txt").write_text("hi")
    os.symlink("/etc", workspace / "l")
    flat = execute_tool(name="list_files", workspace=workspace, arguments={})
    assert flat.output.splitlines() == ["d/", "l -> /etc"]
    deep = execute_tool(name="list_files", workspace=workspace, arguments={"recursive": True})
    assert "d/f.txt  (2 bytes)" in deep.output
    assert execute_tool(name="list_files", workspace=workspace, arguments={"path": "l"}).error_code == "denied"


def test_run_command_reports_files_changed_and_publishes_outputs(workspace: Path) -> None:
    result = execute_tool(name="run_command", workspace=workspace,
                          arguments={"command": "mkdir -p outputs && printf report > outputs/r.txt && echo done"})
    assert result.status == "completed" and result.exit_code == 0 and result.output == "done\n"
    assert result.files_changed == {"created": ["outputs", "outputs/r.txt"], "modified": [], "deleted": []}
    assert result.published_files == [{"path": "outputs/r.txt", "size": 6,
                                        "sha256": hashlib.sha256(b"report").hexdigest()}]
    as_dict = result.to_dict()
    assert set(as_dict) >= {"status", "output", "exit_code", "duration_ms", "files_changed", "published_files",
                            "error_code"}
    publish = execute_tool(name="publish_artifact", workspace=workspace, arguments={"path": "outputs/r.txt"})
    assert publish.published_files == result.published_files


def test_run_command_timeout_is_capped_by_the_tool(workspace: Path) -> None:
    result = execute_tool(name="run_command", workspace=workspace, timeout_seconds=1,
                          arguments={"command": "sleep 5", "timeout_seconds": 100})
    assert result.error_code == "timeout" and result.data["timeout_seconds"] == 1 and result.data["timeout_capped"]
    assert result.duration_ms < 3000


def test_run_command_bad_cwd_is_denied(workspace: Path) -> None:
    result = execute_tool(name="run_command", workspace=workspace, arguments={"command": "ls", "cwd": "../.."})
    assert result.error_code == "denied"


@pytest.fixture
def local_http_server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f"hello from {self.headers['Host']} key={self.headers.get('Idempotency-Key')}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def test_http_request_refuses_unlisted_and_private_hosts(settings, local_http_server: int) -> None:  # type: ignore[no-untyped-def]
    workspace = workspace_for("http")
    url = f"http://localhost:{local_http_server}/"
    settings.AGENTOPS_HTTP_ALLOWED_HOSTS = []
    assert execute_tool(name="http_request", workspace=workspace, arguments={"url": url},
                        network="host").error_code == "denied"
    settings.AGENTOPS_HTTP_ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
    settings.AGENTOPS_HTTP_ALLOW_PRIVATE = False
    for target in (url, f"http://127.0.0.1:{local_http_server}/", "http://127.0.0.1:6379/"):
        result = execute_tool(name="http_request", workspace=workspace, arguments={"url": target}, network="host")
        assert result.error_code == "denied" and "private or loopback" in result.error_message
    assert execute_tool(name="http_request", workspace=workspace, arguments={"url": url},
                        network="none").error_code == "denied"
    settings.AGENTOPS_HTTP_ALLOW_PRIVATE = True
    result = execute_tool(name="http_request", workspace=workspace, arguments={"url": url}, network="host")
    assert result.status == "completed" and result.data["status_code"] == 200
    assert f"hello from localhost:{local_http_server}" in result.output  # the Host header survives pinning


def test_http_request_sends_the_steps_idempotency_key(settings, local_http_server: int) -> None:  # type: ignore[no-untyped-def]
    """A request re-run after a crash (in_doubt, then a reviewer's retry) carries the same key, so the
    server can apply it once; found by the chaos proof (issue 13)."""
    settings.AGENTOPS_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.AGENTOPS_HTTP_ALLOW_PRIVATE = True
    workspace = workspace_for("http-key")
    url = f"http://127.0.0.1:{local_http_server}/"
    for _ in range(2):
        result = execute_tool(name="http_request", workspace=workspace, arguments={"url": url}, network="host",
                              idempotency_key="turn-1:call_7")
        assert result.status == "completed" and "key=turn-1:call_7" in result.output
    own = execute_tool(name="http_request", workspace=workspace, network="host", idempotency_key="turn-1:call_8",
                       arguments={"url": url, "headers": {"idempotency-key": "mine"}})
    assert "key=mine" in own.output
# --- http_request: a total deadline, odd input, addresses that tunnel or translate inward (issue 12, point 8) --------

@pytest.fixture
def dripping_server() -> Iterator[int]:
    """Sends its headers, then one body byte every 0.3 s, forever: each read finishes well
    within any per-read timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                try:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                    while not stop.is_set():
                        conn.sendall(b"x")
                        time.sleep(0.3)
                except OSError:
                    continue

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    stop.set()
    listener.close()


def test_http_request_has_a_total_deadline(settings, dripping_server: int) -> None:  # type: ignore[no-untyped-def]
    settings.AGENTOPS_HTTP_ALLOWED_HOSTS, settings.AGENTOPS_HTTP_ALLOW_PRIVATE = ["127.0.0.1"], True
    started = time.monotonic()
    result = execute_tool(name="http_request", workspace=workspace_for("http-drip"), timeout_seconds=2,
                          arguments={"url": f"http://127.0.0.1:{dripping_server}/"}, network="host")
    assert result.error_code == "timeout" and "total deadline" in result.error_message
    assert time.monotonic() - started < 3.5


@pytest.mark.parametrize("address", ["64:ff9b::a00:1", "64:ff9b::7f00:1", "64:ff9b:1::a00:1", "2002:a00:1::1",
                                     "2002:7f00:1::1", "fec0::1", "::ffff:10.0.0.1", "::ffff:127.0.0.1",
                                     "::ffff:169.254.169.254", "::10.0.0.1", "2001:0:4136:e378:8000:63bf:3fff:fdd2"])
def test_http_request_refuses_nat64_6to4_site_local_and_mapped_private(settings, address: str) -> None:  # type: ignore[no-untyped-def]
    settings.AGENTOPS_HTTP_ALLOWED_HOSTS, settings.AGENTOPS_HTTP_ALLOW_PRIVATE = ["*"], False
    result = execute_tool(name="http_request", workspace=workspace_for("http-v6"),
                          arguments={"url": f"http://[{address}]/"}, network="host")
    assert result.error_code == "denied" and "private" in result.error_message, result


@pytest.mark.parametrize(("url", "headers"), [
    ("http://127.0.0.1:99999/", {}), ("http://127.0.0.1:abc/", {}), ("http://[::1/", {}), ("http://127.0.0.1:0/", {}),
    ("http://127.0.0.1/", {"X-A": "line\r\nInjected: 1"}), ("http://127.0.0.1/", {"X-A": "caf\u00e9 \u2603"}),
    ("http://127.0.0.1/", {"Bad Name": "x"}), ("http://127.0.0.1/", {"X-A": "nul\x00"}),
])
def test_http_request_odd_urls_and_headers_are_invalid_arguments(settings, url: str,  # type: ignore[no-untyped-def]
                                                                 headers: dict[str, str]) -> None:
    settings.AGENTOPS_HTTP_ALLOWED_HOSTS, settings.AGENTOPS_HTTP_ALLOW_PRIVATE = ["*"], True
    arguments: dict[str, object] = {"url": url, **({"headers": headers} if headers else {})}
    result = execute_tool(name="http_request", workspace=workspace_for("http-odd"), arguments=arguments,
                          network="host")
    assert result.error_code == "invalid_arguments", result


@pytest.fixture
def odd_charset_server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            charset = self.path.strip("/")
            body = "héllo".encode("latin-1")
            self.send_response(200)
            self.send_header("Content-Type", f"text/plain; charset={charset}")
            self.send_header("X-Odd", "v\u00e9".encode("latin-1").decode("latin-1"))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.mark.parametrize(("charset", "text"), [("latin-1", "héllo"), ("x-no-such-charset", "h\ufffdllo"),
                                               ("base64", "h\ufffdllo"), ("utf-7", "h\ufffdllo")])
def test_http_request_odd_charsets_read_without_failing(settings, odd_charset_server: int, charset: str,  # type: ignore[no-untyped-def]
                                                        text: str) -> None:
    settings.AGENTOPS_HTTP_ALLOWED_HOSTS, settings.AGENTOPS_HTTP_ALLOW_PRIVATE = ["127.0.0.1"], True
    result = execute_tool(name="http_request", workspace=workspace_for("http-charset"),
                          arguments={"url": f"http://127.0.0.1:{odd_charset_server}/{charset}"}, network="host")
    assert result.status == "completed", result
    assert result.output.endswith(text)
