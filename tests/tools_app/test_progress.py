"""A running command's live output: batched, rate-limited, capped; structured progress lines.
The batcher's rules against a controlled clock, then a real command under bubblewrap."""

import time
from typing import Any

import pytest

from tools_app.sandbox import OutputBatcher, SandboxPolicy, parse_progress, run_sandboxed, workspace_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _batcher(**limits: Any) -> tuple[OutputBatcher, list[dict[str, Any]], Clock]:
    sent: list[dict[str, Any]] = []
    clock = Clock()
    options = {"interval": 0.5, "max_bytes": 1000, "max_batches": 100, **limits}
    return OutputBatcher(sent.append, clock=clock, **options), sent, clock


def test_parse_progress_reads_done_total_and_note_and_refuses_the_rest() -> None:
    assert parse_progress('@@progress {"done": 40, "total": 100, "note": "tests"}') == {
        "done": 40, "total": 100, "percent": 40, "note": "tests"}
    assert parse_progress('@@progress {"done": 3}') == {"done": 3}
    assert parse_progress('@@progress {"done": 150, "total": 100}')["percent"] == 100  # type: ignore[index]
    for line in ('@@progress {"done": -1}', '@@progress {"done": true}', "@@progress [1]", "@@progress {",
                 'progress {"done": 1}', '@@progress{"done": 1}'):
        assert parse_progress(line) is None, line


def test_batcher_sends_at_most_one_batch_per_interval() -> None:
    batcher, sent, clock = _batcher()
    for i in range(50):  # 50 chunks in 0.98 s
        clock.now = i * 0.02
        batcher.feed("stdout", f"line {i}\n".encode())
        batcher.tick()
    batcher.close()
    assert len(sent) == 2  # at 0.5 s, then the rest when it ends
    assert "".join(b.get("stdout", "") for b in sent) == "".join(f"line {i}\n" for i in range(50))
    assert [b["batch"] for b in sent] == [1, 2]


def test_batcher_takes_progress_lines_out_of_the_text_and_keeps_the_newest() -> None:
    batcher, sent, clock = _batcher()
    batcher.feed("stdout", b'compiling\n@@progress {"done": 1, "total": 4}\n@@progress {"done": 2, "tot')
    batcher.feed("stdout", b'al": 4}\nlinking\n')
    batcher.feed("stderr", b"warning: x\n")
    clock.now = 1.0
    batcher.tick()
    assert sent == [{"stdout": "compiling\nlinking\n", "stderr": "warning: x\n",
                     "progress": {"done": 2, "total": 4, "percent": 50}, "batch": 1}]


def test_batcher_holds_back_a_partial_line_that_may_be_progress() -> None:
    batcher, sent, clock = _batcher()
    batcher.feed("stdout", b"ok\n@@prog")
    clock.now = 1.0
    batcher.tick()
    assert sent[-1]["stdout"] == "ok\n"
    batcher.feed("stdout", b'ress {"done": 9, "total": 10}\n')
    clock.now = 2.0
    batcher.tick()
    assert sent[-1] == {"progress": {"done": 9, "total": 10, "percent": 90}, "batch": 2}


def test_batcher_caps_the_live_text_and_the_number_of_batches() -> None:
    batcher, sent, clock = _batcher(max_bytes=100, max_batches=4)
    for i in range(20):
        clock.now = float(i)
        batcher.feed("stdout", b"x" * 30 + b"\n")
        batcher.tick()
    batcher.close()
    assert sum(len(b.get("stdout", "")) for b in sent) == 100
    assert [b.get("truncated", False) for b in sent].count(True) == 1
    assert len(sent) == 3  # nothing more to say once the text is cut

    batcher, sent, clock = _batcher(max_batches=4)
    for i in range(20):  # progress keeps coming, one batch per second
        clock.now = float(i)
        batcher.feed("stdout", f'@@progress {{"done": {i}}}\n'.encode())
        batcher.tick()
    batcher.close()
    assert len(sent) == 4


def test_batcher_decodes_utf8_split_across_chunks() -> None:
    batcher, sent, _clock = _batcher()
    data = "héllo ✓\n".encode()
    batcher.feed("stdout", data[:2])
    batcher.feed("stdout", data[2:])
    batcher.close()
    assert sent[0]["stdout"] == "héllo ✓\n"


def test_batcher_survives_a_failing_sink() -> None:
    def broken(batch: dict[str, Any]) -> None:
        raise RuntimeError("database down")

    batcher = OutputBatcher(broken, interval=0.0, max_bytes=100, max_batches=10)
    batcher.feed("stdout", b"a\n")
    batcher.tick()
    batcher.close()  # no exception: the command goes on


def test_run_sandboxed_streams_output_while_the_command_runs(real_sandbox: dict[str, object]) -> None:
    workspace = workspace_for("s-progress")
    batches: list[tuple[float, dict[str, Any]]] = []
    started = time.monotonic()
    live = OutputBatcher(lambda b: batches.append((time.monotonic() - started, b)), interval=0.4,
                         max_bytes=10_000, max_batches=100)
    command = ('for i in 1 2 3 4 5 6 7 8 9 10; do echo "step $i"; '
               'echo "@@progress {\\"done\\": $i, \\"total\\": 10}"; echo "err $i" >&2; sleep 0.2; done')
    result = run_sandboxed(workspace=workspace, command=command, policy=SandboxPolicy(timeout_seconds=20,
                                                                                     cpu_seconds=20), live=live)
    assert result.exit_code == 0, result.stderr
    duration = time.monotonic() - started
    # Sent while it ran (not all at the end), and at most one batch per interval, plus the last one.
    assert len(batches) >= 3
    assert batches[0][0] < duration - 0.5
    assert len(batches) <= duration / 0.4 + 2
    gaps = [b[0] - a[0] for a, b in zip(batches, batches[1:], strict=False)]
    assert all(gap >= 0.35 for gap in gaps[:-1]), gaps
    stdout = "".join(b.get("stdout", "") for _t, b in batches)
    assert stdout == "".join(f"step {i}\n" for i in range(1, 11))  # progress lines taken out
    assert "".join(b.get("stderr", "") for _t, b in batches) == "".join(f"err {i}\n" for i in range(1, 11))
    progress = [b["progress"] for _t, b in batches if "progress" in b]
    assert progress[-1] == {"done": 10, "total": 10, "percent": 100}
    assert len(progress) >= 2 and progress[0]["done"] < 10
    assert '@@progress {"done": 10, "total": 10}' in result.stdout  # the result keeps everything


@pytest.mark.django_db
def test_nul_in_a_commands_output_is_stored_as_a_replacement_character(real_sandbox: Any) -> None:
    """``find -print0`` or a binary file: PostgreSQL's text and jsonb refuse NUL, and the write of the
    whole outcome (or of its live output) failed (a sandbox audit, 2026-12-04)."""
    from sessions_app.models import Step
    from tests import factories
    from tools_app.builtin import execute_tool

    batcher, sent, _ = _batcher(interval=0.0)
    batcher.feed("stdout", b"a\x00b\n")
    batcher.close()
    assert "\x00" not in "".join(str(m) for m in sent) and "a\ufffdb" in "".join(str(m) for m in sent)
    result = execute_tool(name="run_command", workspace=workspace_for("s-nul"),
                          arguments={"command": "printf 'a\\0b'"}).to_dict()
    assert result["status"] == "completed" and result["output"] == "a\ufffdb", result
    step = factories.step(factories.turn(factories.session()), tool_name="run_command")
    Step.objects.filter(pk=step.pk).update(result=result)  # PostgreSQL: refused with the NUL
    step.refresh_from_db()
    assert (step.result or {})["output"] == "a\ufffdb"
