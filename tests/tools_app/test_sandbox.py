import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from tools_app.sandbox import (
    NotARegularFile,
    PathDenied,
    SandboxPolicy,
    SandboxUnavailable,
    manifest_diff,
    run_sandboxed,
    sandbox_ids,
    sandbox_status,
    workspace_changed_since,
    workspace_file_sha256,
    workspace_for,
    workspace_manifest,
)
from tools_app.sandbox import argv as argv_module
from tools_app.sandbox import backend as backend_module
from tools_app.sandbox import process as process_module

POLICY = SandboxPolicy(timeout_seconds=5, cpu_seconds=5)


def test_workspace_for_creates_a_private_directory_owned_by_the_sandbox_uid(_workspace_root: Path) -> None:
    workspace = workspace_for("3f2b8c1e-0000-4000-8000-000000000001")
    st = workspace.stat()
    assert workspace.parent == _workspace_root.resolve()
    assert (st.st_uid, st.st_gid) == sandbox_ids()
    assert st.st_mode & 0o777 == 0o700
    assert workspace_for("3f2b8c1e-0000-4000-8000-000000000001") == workspace


@pytest.mark.parametrize("bad", ["../escape", "a/b", "", ".."])
def test_workspace_for_refuses_ids_that_are_not_names(bad: str) -> None:
    with pytest.raises(ValueError):
        workspace_for(bad)


def test_sandbox_status_reports_bubblewrap(real_sandbox: dict[str, object]) -> None:
    assert set(real_sandbox) >= {"backend", "ok", "detail"}
    assert "self-test passed" in str(real_sandbox["detail"])


def test_run_sandboxed_runs_as_the_sandbox_uid_in_the_workspace(real_sandbox: dict[str, object]) -> None:
    workspace = workspace_for("s-basic")
    result = run_sandboxed(workspace=workspace, command="id -u; pwd; echo hello > f.txt; echo oops >&2; exit 3",
                           policy=POLICY)
    assert result.exit_code == 3 and result.error_code == ""
    assert result.stdout.split() == [str(sandbox_ids()[0]), "/workspace"]
    assert result.stderr == "oops\n"
    assert (workspace / "f.txt").read_text() == "hello\n"
    assert os.stat(workspace / "f.txt").st_uid == sandbox_ids()[0]


def test_two_sessions_writing_the_same_path_never_see_each_other(real_sandbox: dict[str, object]) -> None:
    first, second = workspace_for("s-one"), workspace_for("s-two")
    results: dict[str, str] = {}

    def write_then_read(name: str, workspace: Path) -> None:
        result = run_sandboxed(workspace=workspace, command=f"echo {name} > same.txt; sleep 0.3; cat same.txt; ls",
                               policy=POLICY)
        results[name] = result.stdout

    threads = [threading.Thread(target=write_then_read, args=(name, ws)) for name, ws in
               (("one", first), ("two", second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {"one": "one\nsame.txt\n", "two": "two\nsame.txt\n"}
    assert (first / "same.txt").read_text() == "one\n"
    assert (second / "same.txt").read_text() == "two\n"


def test_cwd_must_stay_inside_the_workspace(real_sandbox: dict[str, object]) -> None:
    workspace = workspace_for("s-cwd")
    (workspace / "sub").mkdir()
    assert run_sandboxed(workspace=workspace, command="pwd", cwd="sub", policy=POLICY).stdout == "/workspace/sub\n"
    from tools_app.sandbox import PathDenied

    with pytest.raises(PathDenied):
        run_sandboxed(workspace=workspace, command="pwd", cwd="../", policy=POLICY)
    os.symlink("/etc", workspace / "etc-link")
    with pytest.raises(PathDenied):
        run_sandboxed(workspace=workspace, command="pwd", cwd="etc-link", policy=POLICY)


def test_should_cancel_kills_the_command(real_sandbox: dict[str, object]) -> None:
    workspace = workspace_for("s-cancel")
    started = time.monotonic()
    result = run_sandboxed(workspace=workspace, command="sleep 30", policy=POLICY,
                           should_cancel=lambda: time.monotonic() - started > 0.3)
    assert result.error_code == "cancelled"
    assert time.monotonic() - started < 2


def test_output_over_the_cap_keeps_head_and_tail_and_says_how_much_was_cut(real_sandbox: dict[str, object]) -> None:
    workspace = workspace_for("s-cap")
    policy = SandboxPolicy(timeout_seconds=5, output_cap_bytes=1000)
    result = run_sandboxed(workspace=workspace, command="echo START; head -c 200000 /dev/zero | tr '\\0' x; echo; "
                           "echo END", policy=policy)
    assert result.error_code == "" and result.exit_code == 0
    assert result.stdout.startswith("START") and result.stdout.rstrip().endswith("END")
    assert result.stdout_bytes == 200000 + len("START\n\nEND\n")
    assert result.stdout_truncated_bytes == result.stdout_bytes - 1000
    assert f"[... {result.stdout_truncated_bytes} bytes cut ...]" in result.stdout


def test_file_size_limit(real_sandbox: dict[str, object]) -> None:
    workspace = workspace_for("s-fsize")
    policy = SandboxPolicy(timeout_seconds=5, file_size_bytes=1024 * 1024)
    result = run_sandboxed(workspace=workspace, command="head -c 10000000 /dev/zero > big", policy=policy)
    assert result.error_code == "limit_exceeded" and "file_size" in result.limits_hit
    assert (workspace / "big").stat().st_size <= 1024 * 1024


def test_cpu_limit(real_sandbox: dict[str, object]) -> None:
    workspace = workspace_for("s-cpu")
    policy = SandboxPolicy(timeout_seconds=60, cpu_seconds=1)
    result = run_sandboxed(workspace=workspace, command="while :; do :; done", policy=policy)
    # The CPU limit ended it, not the wall-clock timeout: 1 s of CPU can take several seconds of wall
    # time on a loaded 2-core machine (it took 5.5 s beside two other pytest workers), so the bound
    # is the policy's timeout, far away, rather than a guess at the machine's load.
    assert result.error_code == "limit_exceeded" and result.limits_hit == ["cpu"]
    assert result.duration_ms < policy.timeout_seconds * 1000


def test_network_none_has_only_loopback_and_host_network_is_shared(real_sandbox: dict[str, object]) -> None:
    workspace = workspace_for("s-net")
    none = run_sandboxed(workspace=workspace, command="ls /sys/class/net 2>/dev/null || cat /proc/net/dev",
                         policy=POLICY)
    assert "eth" not in none.stdout and "lo" in none.stdout
    host = run_sandboxed(workspace=workspace, command="cat /proc/net/dev",
                         policy=SandboxPolicy(network="host", timeout_seconds=5))
    assert host.stdout.count(":") > none.stdout.count(":")


def test_manifest_diff_reports_created_modified_and_deleted(real_sandbox: dict[str, object]) -> None:
    workspace = workspace_for("s-manifest")
    (workspace / "keep.txt").write_text("same")
    (workspace / "edit.txt").write_text("before")
    (workspace / "gone.txt").write_text("bye")
    for name in ("keep.txt", "edit.txt", "gone.txt"):
        os.chown(workspace / name, *sandbox_ids())  # as write_file leaves them: editable by the sandbox
    before = workspace_manifest(workspace)
    assert before["entries"]["edit.txt"]["sha256"]
    assert not workspace_changed_since(workspace, before)
    result = run_sandboxed(workspace=workspace, command="echo after > edit.txt; rm gone.txt; mkdir d; "
                           "echo n > d/new.txt", policy=POLICY)
    assert result.exit_code == 0, result.stderr
    after = workspace_manifest(workspace, reuse=before)
    assert manifest_diff(before, after) == {"created": ["d", "d/new.txt"], "modified": ["edit.txt"],
                                            "deleted": ["gone.txt"], "truncated": False}
    assert workspace_changed_since(workspace, before)
    assert not workspace_changed_since(workspace, after)


def test_workspace_changed_since_sees_same_size_rewrites_and_unknown_manifests(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("aaaa")
    manifest = workspace_manifest(tmp_path)
    stat = (tmp_path / "a").stat()
    (tmp_path / "a").write_text("bbbb")
    os.utime(tmp_path / "a", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    assert workspace_changed_since(tmp_path, manifest)
    assert workspace_changed_since(tmp_path, {"garbage": True})


def test_workspace_file_sha256_hashes_regular_files_only_and_stays_inside(_workspace_root: Path) -> None:
    workspace = workspace_for("s-sha")
    (workspace / "d").mkdir()
    (workspace / "d" / "f.bin").write_bytes(b"\x00abc" * 300_000)  # more than one read chunk
    assert workspace_file_sha256(workspace, "d/f.bin") == (1_200_000, hashlib.sha256(b"\x00abc" * 300_000).hexdigest())
    os.mkfifo(workspace / "fifo")  # opened without a writer: it must be refused, not hang the worker
    for path in ("fifo", "d", ""):
        with pytest.raises(NotARegularFile):
            workspace_file_sha256(workspace, path)
    secret = _workspace_root / "outside.txt"
    secret.write_text("secret")
    os.symlink(secret, workspace / "out-link")
    with pytest.raises(PathDenied):
        workspace_file_sha256(workspace, "out-link")
    with pytest.raises(FileNotFoundError):
        workspace_file_sha256(workspace, "nope")


def test_a_sandbox_that_cannot_start_is_a_sandbox_error_and_leaks_no_descriptor(
        real_sandbox: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    workspace = workspace_for("s-nostart")
    monkeypatch.setattr(argv_module, "HOST_SH", "/nonexistent/sh")  # the launcher cannot be executed
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        result = run_sandboxed(workspace=workspace, command="true", policy=POLICY)
        assert result.error_code == "sandbox_error" and "could not start the sandbox" in result.error_message
    assert len(os.listdir("/proc/self/fd")) == before


def test_no_backend_raises_unless_unsafe_is_allowed(settings, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(backend_module, "_candidate_backends", lambda: [])
    try:
        status = sandbox_status(refresh=True)
        assert status["ok"] is False and status["backend"] == "none"
        with pytest.raises(SandboxUnavailable):
            run_sandboxed(workspace=workspace_for("s-none"), command="true", policy=POLICY)
        settings.AGENTOPS_SANDBOX_ALLOW_UNSAFE = True
        status = sandbox_status(refresh=True)
        assert status == {**status, "backend": "unsafe-subprocess", "ok": True, "unsafe": True}
        result = run_sandboxed(workspace=workspace_for("s-none"), command="echo hi; id -u", policy=POLICY)
        assert result.backend == "unsafe-subprocess" and result.stdout.split() == ["hi", str(sandbox_ids()[0])]
    finally:
        monkeypatch.undo()
        settings.AGENTOPS_SANDBOX_ALLOW_UNSAFE = False
        assert sandbox_status(refresh=True)["ok"]


def test_an_unreachable_workspace_root_is_a_clear_sandbox_error(settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tools_app.builtin import execute_tool

    hidden = tmp_path / "hidden"  # pytest's own tmp dirs are 0700: the sandbox uid cannot traverse them
    hidden.mkdir(mode=0o700)
    settings.AGENTOPS_WORKSPACE_ROOT = hidden / "root"
    assert sandbox_status(refresh=True)["ok"]  # the self-test does not depend on the configured root
    result = execute_tool(name="run_command", workspace=workspace_for("s-hidden"), arguments={"command": "true"})
    assert result.error_code == "sandbox_error" and "lacks o+x" in result.error_message


def test_command_env_reaches_the_command_exactly_and_never_its_command_line(
        real_sandbox: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool's command environment (secrets resolved by the engine) is a file bound from a pipe
    and sourced: quotes, $ and backticks arrive verbatim, and no value is on any argv."""
    workspace = workspace_for("envtest")
    value = "it's $HOME `id` \"q\" \\ end"
    seen_argv: list[list[str]] = []
    real_execute = process_module._execute

    def spy(argv: list[str], **kwargs: object) -> object:
        seen_argv.append(list(argv))
        return real_execute(argv, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(process_module, "_execute", spy)
    result = run_sandboxed(workspace=workspace, command='printf "%s|%s" "$API_TOKEN" "$HOME"',
                           policy=SandboxPolicy(timeout_seconds=20), env={"API_TOKEN": value})
    assert result.stdout == f"{value}|/workspace", result
    assert seen_argv and not any(value in arg for argv in seen_argv for arg in argv)
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        argv_module.env_file_data({"BAD-NAME": "x"})
