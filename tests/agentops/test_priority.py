"""Background processes at a lower CPU priority (agentops/priority.py), on a real child process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentops import priority


def _child() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)


def test_background_lowers_the_nice_value_and_the_sessions_autogroup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTOPS_BACKGROUND_NICE", raising=False)
    proc = _child()
    try:
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == os.getpriority(os.PRIO_PROCESS, 0)
        priority.background(proc.pid)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == priority.DEFAULT_BACKGROUND_NICE == 10
        if Path(f"/proc/{proc.pid}/autogroup").exists():  # Linux with autogroup scheduling (this machine, CI)
            assert priority.autogroup_nice(proc.pid) == 10
            assert priority.autogroup_nice(os.getpid()) != 10  # the caller's session keeps its own
    finally:
        proc.kill()
        proc.wait()


def test_zero_leaves_the_priority_alone_and_the_setting_is_clamped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTOPS_BACKGROUND_NICE", "0")
    proc = _child()
    try:
        before = os.getpriority(os.PRIO_PROCESS, proc.pid)
        priority.background(proc.pid)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == before
    finally:
        proc.kill()
        proc.wait()
    monkeypatch.setenv("AGENTOPS_BACKGROUND_NICE", "99")
    assert priority.background_nice() == 19
    monkeypatch.setenv("AGENTOPS_BACKGROUND_NICE", "-5")
    assert priority.background_nice() == 0
