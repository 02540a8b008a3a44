"""Both command lines, `python -m scripted_model` and `manage.py scripted_model`, as real processes."""

import json
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
def test_scripted_model_cli_announces_its_url_and_takes_every_option(command: list[str], tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    argv = [*command, "--port", "0", "--quiet", "--api-key", "right", "--request-log", str(log),
            "--context-window", "50"]
    with running(argv, tmp_path / "stderr") as base_url:
        client = OpenAI(base_url=base_url, api_key="right", max_retries=0)
        models = client.models.list()
        answer = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "say hi"}])
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
        with pytest.raises(openai.BadRequestError) as too_long:
            client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "say " + "x" * 300}])
        logged = [json.loads(line) for line in log.read_text().splitlines()]

    assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
    assert [m.id for m in models.data] == ["scripted"]
    assert answer.choices[0].message.content == "hi"
    assert too_long.value.code == "context_length_exceeded"
    assert [(e["seq"], e["kind"], e["status"]) for e in logged] == [(1, "text", 200), (2, "error", 400)]
    assert logged[0]["last_user_message"] == "say hi"
    assert "GET /v1/models" not in (tmp_path / "stderr").read_text()  # --quiet: no access log
