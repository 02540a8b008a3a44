"""Bad input and attacks, each run under real bubblewrap: refused or contained with a clear error code,
and the host and other sessions unchanged afterwards."""

import json
import os
import shlex
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tools_app.conftest import sandbox_uid_pids
from tools_app.builtin import execute_tool
from tools_app.sandbox import CommandResult, SandboxPolicy, run_sandboxed, workspace_for, workspace_manifest

pytestmark = pytest.mark.usefixtures("real_sandbox")


def run(workspace: Path, command: str, timeout: int = 5) -> dict[str, object]:
    return execute_tool(name="run_command", workspace=workspace, arguments={"command": command},
                        timeout_seconds=timeout).to_dict()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:  # it exited meanwhile
        return ""


def test_attack_read_etc_shadow_is_refused() -> None:
    workspace = workspace_for("atk-shadow")
    result = run(workspace, "cat /etc/shadow; ls /etc")
    assert "root:" not in str(result["output"]) and "No such file" in str(result["output"])
    for path in ("/etc/shadow", "../../../../etc/shadow", "/workspace/../etc/shadow"):
        denied = execute_tool(name="read_file", workspace=workspace, arguments={"path": path})
        assert denied.error_code == "denied", path
    run(workspace, "ln -s /etc/shadow shadow-link")  # a symlink planted to trick the host-side reader
    via_link = execute_tool(name="read_file", workspace=workspace, arguments={"path": "shadow-link"})
    assert via_link.error_code == "denied" and "root:" not in via_link.output


def test_attack_host_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTOPS_TEST_SECRET", "hunter2-secret")
    workspace = workspace_for("atk-env")
    result = run(workspace, "env; cat /proc/1/environ; cat /proc/*/environ; ps -ef 2>/dev/null; ls /proc")
    assert result["status"] == "completed"
    assert "hunter2-secret" not in str(result["output"])
    assert "DATABASE_URL" not in str(result["output"]) and "DJANGO" not in str(result["output"])


def test_attack_other_sessions_workspace_is_invisible() -> None:
    victim, attacker = workspace_for("atk-victim"), workspace_for("atk-attacker")
    run(victim, "echo top-secret-value > secret.txt")
    before = workspace_manifest(victim)
    result = run(attacker, f"cat ../atk-victim/secret.txt; cat {victim}/secret.txt; "
                           "find / -name secret.txt 2>/dev/null; rm -rf ../atk-victim; ls -a /workspace/..")
    assert "top-secret-value" not in str(result["output"])
    for path in ("../atk-victim/secret.txt", f"{victim}/secret.txt"):
        assert execute_tool(name="read_file", workspace=attacker, arguments={"path": path}).error_code == "denied"
    os.symlink(str(victim), attacker / "victim-link")  # as `ln -s` inside would, with the host path
    assert execute_tool(name="read_file", workspace=attacker,
                        arguments={"path": "victim-link/secret.txt"}).error_code == "denied"
    assert execute_tool(name="write_file", workspace=attacker,
                        arguments={"path": "victim-link/secret.txt", "content": "x"}).error_code == "denied"
    assert workspace_manifest(victim) == before


def test_attack_another_sessions_workspace_is_unreachable_by_host_path_and_dotdot(_workspace_root: Path) -> None:
    """Every session's workspace sits under one root, and every sandbox runs as the same uid: if the
    sandbox bound the root (or any ancestor) in, one session could read all the others."""
    victim, attacker = workspace_for("atk-root-victim"), workspace_for("atk-root-attacker")
    assert victim.parent == attacker.parent == _workspace_root.resolve()
    run(victim, "echo victim-secret-value > secret.txt")
    assert (victim / "secret.txt").read_text() == "victim-secret-value\n"
    root, name = _workspace_root.resolve(), victim.name
    assert not root.is_relative_to("/tmp")  # the sandbox's fresh /tmp would hide a leaked root
    reads = {
        "host path": f"cat {shlex.quote(str(victim))}/secret.txt",
        "host path via ..": f"cat {shlex.quote(str(attacker))}/../{name}/secret.txt",
        ".. from the host cwd": f"cd {shlex.quote(str(attacker))} 2>/dev/null; cat ../{name}/secret.txt",
        ".. from /workspace": f"cat ../{name}/secret.txt",
        "/workspace/..": f"cat /workspace/../{name}/secret.txt",
        ".. up to the root": f"cat ../..{shlex.quote(str(root))}/{name}/secret.txt",
    }
    for how, command in reads.items():
        result = run(attacker, command)
        assert result["status"] == "completed" and result["exit_code"] != 0, (how, result)
        assert "victim-secret-value" not in str(result["output"]), how
        assert "No such file or directory" in str(result["output"]), (how, result["output"])


def test_attack_writing_outside_the_workspace_is_refused(tmp_path: Path) -> None:
    workspace = workspace_for("atk-write")
    outside = Path("/tmp") / f"agentops-pwned-{os.getpid()}"
    for path in ("../pwned", "../../../../tmp/pwned", "/etc/pwned", str(outside), "/workspace/../pwned"):
        result = execute_tool(name="write_file", workspace=workspace, arguments={"path": path, "content": "x"})
        assert result.error_code == "denied", path
    run(workspace, "ln -s /tmp tmp-link; ln -s .. up-link")
    for path in ("tmp-link/" + outside.name, "up-link/pwned"):
        result = execute_tool(name="write_file", workspace=workspace, arguments={"path": path, "content": "x"})
        assert result.error_code == "denied", path
    inside = run(workspace, "echo x > /usr/pwned; echo x > /etc/passwd; echo x > /pwned; echo x > /tmp/t; "
                            f"echo x > {outside}; echo done")
    assert "Read-only file system" in str(inside["output"])
    assert not outside.exists() and not Path("/usr/pwned").exists() and not Path("/pwned").exists()
    assert not (workspace.parent / "pwned").exists()


def connect_probe(port: int) -> str:
    """A command that prints CONNECTED when 127.0.0.1:``port`` accepts a connection, else REFUSED."""
    code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('CONNECTED')\nexcept OSError as e:\n    print('REFUSED', e)\n")
    return f"python3 -c {shlex.quote(code)}"


@pytest.mark.parametrize("port", [6379, 5432])
def test_attack_connecting_to_local_services_fails(port: int) -> None:
    workspace = workspace_for(f"atk-net-{port}")
    result = run(workspace, connect_probe(port))
    assert "REFUSED" in str(result["output"]) and "CONNECTED" not in str(result["output"])


@pytest.fixture
def loopback_listener() -> Iterator[socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(1)
    yield listener
    listener.close()


def test_attack_connecting_to_a_service_on_the_host_loopback_fails(loopback_listener: socket.socket) -> None:
    """Whether 6379 and 5432 have listeners depends on the host; this port surely has one."""
    port = loopback_listener.getsockname()[1]
    workspace = workspace_for("atk-net-listener")
    result = run(workspace, connect_probe(port))
    assert "REFUSED" in str(result["output"]) and "CONNECTED" not in str(result["output"])
    with pytest.raises(TimeoutError):
        loopback_listener.accept()  # and nothing reached the listener
    # The control: on the host network the same probe reaches the same listener.
    shared = run_sandboxed(workspace=workspace, command=connect_probe(port),
                           policy=SandboxPolicy(network="host", timeout_seconds=5))
    assert "CONNECTED" in shared.stdout, shared
    loopback_listener.accept()[0].close()


def test_attack_fork_bomb_is_contained() -> None:
    workspace = workspace_for("atk-fork")
    started = time.monotonic()
    # A function name and a duration no other test uses: other workers' sandboxed commands run as
    # the same uid beside this one (a count of every new pid of the uid failed in CI). The bomb's
    # forks keep the shell's command line, which names the function.
    result = run(workspace, "bomb1019() { bomb1019 | bomb1019 & }; bomb1019; sleep 1019", timeout=3)
    assert result["error_code"] in ("limit_exceeded", "timeout")
    assert "processes" in result["data"]["limits_hit"]  # type: ignore[index]
    assert time.monotonic() - started < 8
    time.sleep(0.2)
    survivors = [pid for pid in sandbox_uid_pids() if "1019" in _cmdline(pid)]
    assert survivors == []  # nothing survived
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


def test_attack_2gb_allocation_is_refused() -> None:
    workspace = workspace_for("atk-mem")
    result = run(workspace, "python3 -c 'b = bytearray(2 * 1024 ** 3); b[-1] = 1; print(len(b))'")
    assert result["error_code"] == "limit_exceeded" and "memory" in result["data"]["limits_hit"]  # type: ignore[index]
    assert "MemoryError" in str(result["output"])


def test_attack_infinite_loop_times_out() -> None:
    workspace = workspace_for("atk-loop")
    started = time.monotonic()
    # A duration no other test sleeps: other workers' sandboxed commands run beside this one.
    result = run(workspace, "sleep 1017 & while :; do :; done", timeout=2)
    assert result["error_code"] in ("timeout", "limit_exceeded")
    assert time.monotonic() - started < 5
    time.sleep(0.2)
    assert not [pid for pid in sandbox_uid_pids() if "sleep\x001017" in _cmdline(pid)]


def test_attack_100mb_of_stdout_is_capped_and_killed() -> None:
    workspace = workspace_for("atk-stdout")
    started = time.monotonic()
    result = run(workspace, "head -c 100000000 /dev/zero | tr '\\0' x", timeout=20)
    assert result["error_code"] == "limit_exceeded" and "output" in result["data"]["limits_hit"]  # type: ignore[index]
    assert len(str(result["output"])) < 200_000
    assert result["data"]["stdout_truncated_bytes"] > 0  # type: ignore[index]
    assert time.monotonic() - started < 10


def test_attack_10mb_argument_is_refused() -> None:
    workspace = workspace_for("atk-arg")
    huge = "x" * (10 * 1024 * 1024)
    for name, arguments in (("run_command", {"command": "echo " + huge}),
                            ("write_file", {"path": "big.txt", "content": huge}),
                            ("run_command", json.dumps({"command": "echo " + huge}))):
        result = execute_tool(name=name, workspace=workspace, arguments=arguments)
        assert result.error_code == "invalid_arguments"
        assert len(result.output) < 2000
    assert not (workspace / "big.txt").exists()
    # Below the tool's schema cap, the kernel's own single-argument limit is not reached either.
    near_cap = run_sandboxed(workspace=workspace, command="echo " + "y" * 60000 + " | wc -c",
                             policy=SandboxPolicy(timeout_seconds=5))
    assert near_cap.stdout.strip() == "60001"


@pytest.mark.parametrize("arguments", ['{"command": ', "not json", "[1, 2]", '"a string"', "42",
                                       '{"command": 5}', '{"command": "ls", "sudo": true}', "{}"])
def test_attack_invalid_json_arguments_are_refused(arguments: str) -> None:
    result = execute_tool(name="run_command", workspace=workspace_for("atk-json"), arguments=arguments)
    assert result.status == "failed" and result.error_code == "invalid_arguments"


@pytest.mark.parametrize("name", ["rm_rf", "", "../run_command", "RUN_COMMAND", "x" * 10000])
def test_attack_unknown_tools_are_refused(name: str) -> None:
    result = execute_tool(name=name, workspace=workspace_for("atk-unknown"), arguments={"command": "id"})
    assert result.status == "failed" and result.error_code == "unknown_tool" and len(result.output) < 1000


# --- issue 12, point 5: every writable filesystem capped, a memory limit, no nested namespaces, seccomp -----------

def sandboxed(command: str, workspace: Path | None = None, **policy: Any) -> CommandResult:
    return run_sandboxed(workspace=workspace or workspace_for(f"atk-{uuid.uuid4().hex[:8]}"), command=command,
                         policy=SandboxPolicy(timeout_seconds=20, **policy))


def test_attack_nested_user_namespace_is_refused() -> None:
    result = sandboxed("unshare -Ur id; echo rc=$?; unshare -n true; echo rc=$?; unshare -m true; echo rc=$?")
    assert result.stdout.split() == ["rc=1", "rc=1", "rc=1"], result
    assert "uid=0" not in result.stdout and "Operation not permitted" in result.stderr


def test_attack_seccomp_filter_is_on_and_refuses_dangerous_calls() -> None:
    probe = (
        "import ctypes, errno, json\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "calls = {'unshare': (272, 0x10000000), 'setns': (308, 0, 0), 'mount': (165, 0, 0, 0, 0, 0),\n"
        "         'ptrace': (101, 16, 1, 0, 0), 'bpf': (321, 0, 0, 0), 'keyctl': (250, 0, 0, 0),\n"
        "         'perf_event_open': (298, 0, 0, -1, -1, 0), 'userfaultfd': (323, 0), 'add_key': (248, 0, 0, 0, 0),\n"
        "         'open_by_handle_at': (304, 0, 0, 0), 'init_module': (175, 0, 0, 0), 'io_uring_setup': (425, 1, 0)}\n"
        "out = {}\n"
        "for name, (nr, *args) in calls.items():\n"
        "    ctypes.set_errno(0)\n"
        "    rc = libc.syscall(nr, *[ctypes.c_long(a) for a in args])\n"
        "    out[name] = errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno())) if rc == -1 else 'ALLOWED'\n"
        "print(json.dumps(out))\n"
    )
    workspace = workspace_for("atk-seccomp")
    (workspace / "probe.py").write_text(probe)
    result = sandboxed("grep '^Seccomp:' /proc/self/status; python3 probe.py", workspace)
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["Seccomp:", "2"], result  # 2: a filter is on
    refused = json.loads(lines[1])
    assert refused == dict.fromkeys(refused, "EPERM"), refused


def test_attack_writing_600mb_to_dev_shm_fails_at_the_cap() -> None:
    result = sandboxed("dd if=/dev/zero of=/dev/shm/fill bs=1M count=600; df -B1 --output=size /dev/shm | tail -1")
    assert "No space left on device" in result.stderr, result
    assert int(result.stdout.split()[-1]) == SandboxPolicy().tmp_size_bytes


def test_attack_writing_to_dev_and_tmp_is_capped_too() -> None:
    result = sandboxed("touch /dev/evil; echo rc=$?; echo ok > /dev/null && echo null-ok; "
                       "dd if=/dev/zero of=/tmp/fill bs=1M count=600 2>&1 | grep -c 'No space left'")
    assert result.stdout.split() == ["rc=1", "null-ok", "1"], result
    assert "Read-only file system" in result.stderr


def test_attack_memory_hog_is_killed() -> None:
    """Processes each under RLIMIT_AS but together over the limit: the memory cgroup kills them
    (where the host has one; else each process's address space is all that is bounded)."""
    from tools_app.sandbox.cgroup import memory_cgroup_parent

    if memory_cgroup_parent() is None:
        pytest.skip("no writable memory cgroup on this host: RLIMIT_AS only (test_attack_2gb_allocation)")
    hog = "python3 -c 'b = bytearray(150 * 2**20); b[::4096] = b\"x\" * len(b[::4096]); import time; time.sleep(8)'"
    started = time.monotonic()
    result = sandboxed(f"for i in 1 2 3 4; do {hog} & done; wait", memory_bytes=300 * 2**20)
    assert result.error_code == "limit_exceeded" and "memory" in result.limits_hit, result
    assert time.monotonic() - started < 15


def test_attack_filling_the_workspace_past_its_quota_is_stopped() -> None:
    workspace = workspace_for("atk-quota")
    quota = 20 * 2**20
    first = sandboxed("dd if=/dev/zero of=big bs=1M count=30 2>/dev/null; echo wrote", workspace,
                      workspace_quota_bytes=quota)
    assert first.error_code == "limit_exceeded" and "workspace" in first.limits_hit, first
    assert "over its quota" in first.error_message
    second = sandboxed("echo more > marker", workspace, workspace_quota_bytes=quota)
    assert second.error_code == "limit_exceeded" and "workspace" in second.limits_hit  # still over: said again
    freed = sandboxed("rm big; echo ok", workspace, workspace_quota_bytes=quota)
    assert (freed.error_code, freed.stdout.strip()) == ("", "ok")


def test_attack_a_command_filling_the_workspace_is_stopped_while_it_runs() -> None:
    """An audit wrote 2.8 GB into a workspace of 1 GB in two commands, checked only after each:
    one command could fill the host's disk. The quota is watched while the command runs."""
    workspace = workspace_for("atk-quota-live")
    quota = 20 * 2**20
    filler = "for i in $(seq 1 100); do head -c 2000000 /dev/zero > f$i; sleep 0.05; done; echo finished"
    started = time.monotonic()
    result = sandboxed(filler, workspace, workspace_quota_bytes=quota)
    assert result.error_code == "limit_exceeded" and "workspace" in result.limits_hit, result
    assert "the command was stopped: the workspace grew to" in result.error_message
    assert "finished" not in result.stdout and time.monotonic() - started < 6
    written = sum(f.stat().st_size for f in workspace.iterdir())
    assert quota < written < 100 * 2_000_000 // 2, written  # stopped within a second or two, far from 200 MB
    # Over its quota already, a command that frees space runs (and one that grows it is stopped).
    freed = sandboxed("rm f1 f2 f3; echo ok", workspace, workspace_quota_bytes=quota)
    assert freed.stdout.strip() == "ok" and "stopped" not in freed.error_message
