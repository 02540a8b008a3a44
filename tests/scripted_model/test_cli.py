"""Both command lines, `python -m scripted_model` and `manage.py scripted_model`, as real processes."""

import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
from openai import OpenAI

ROOT = Path(__file__).resolve().parents[2]
LISTENING = "scripted model listening on "

COMMANDS = {
    "python -m": [sys.executable, "-m", "scripted_model"],
    "manage.py": [sys.executable, "manage.py", "scripted_model"],
}


@contextmanager
def running(argv: list[str], stderr_path: Path, timeout: float = 30) -> Iterator[str]:
    """Start the server, read the URL it announces on stdout, and stop it on exit."""
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        line = process.stdout.readline() if ready else ""
        assert line.startswith(LISTENING), f"no announcement: {line!r}; stderr: {stderr_path.read_text()}"
        yield line.removeprefix(LISTENING).strip()
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_scripted_model_cli_announces_its_url_and_checks_the_key(command: list[str], tmp_path: Path) -> None:
    with running([*command, "--port", "0", "--quiet", "--api-key", "right"], tmp_path / "stderr") as base_url:
        models = OpenAI(base_url=base_url, api_key="right", max_retries=0).models.list()
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()

    assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
    assert [m.id for m in models.data] == ["scripted"]
    assert "GET /v1/models" not in (tmp_path / "stderr").read_text()  # --quiet: no access log
