"""Live output of a running command: its stdout/stderr in batches, and structured progress.

A command's output reaches the timeline while it runs, without one event per chunk: the batcher
collects what the pipes give and hands a batch to ``sink`` at most once per ``interval`` seconds
(and once at the end), and stops streaming text after ``max_bytes`` (the full capped output is
still in the result) and sends nothing after ``max_batches``. A step's live output therefore costs
a bounded number of events whatever the command prints.

Structured progress is a line the command prints on stdout::

    @@progress {"done": 40, "total": 100, "note": "tests"}

The newest such line of a batch goes out as ``progress`` (``done`` and ``total`` numbers, ``note``
text); the line itself is left out of the live text (it stays in the result).
"""

import codecs
import json
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

PROGRESS_PREFIX = "@@progress "
NOTE_MAX_CHARS = 200
# A partial last line is held back (it may be a progress line cut in two) up to this long.
CARRY_MAX_CHARS = 4096

Sink = Callable[[dict[str, Any]], None]


def parse_progress(line: str) -> dict[str, Any] | None:
    """The structured progress a line reports, or None when it is not a valid progress line."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        data = json.loads(line[len(PROGRESS_PREFIX):])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    done, total = data.get("done"), data.get("total")
    if not isinstance(done, int | float) or isinstance(done, bool) or done < 0:
        return None
    progress: dict[str, Any] = {"done": done}
    if isinstance(total, int | float) and not isinstance(total, bool) and total > 0:
        progress["total"] = total
        progress["percent"] = max(0, min(100, round(100 * done / total)))
    if isinstance(data.get("note"), str):
        progress["note"] = data["note"][:NOTE_MAX_CHARS]
    return progress


class OutputBatcher:
    """Feeds on a command's output chunks; calls ``sink`` with batches, rate-limited and capped."""

    def __init__(self, sink: Sink, *, interval: float, max_bytes: int, max_batches: int,
                 clock: Callable[[], float] = time.monotonic, hold: Callable[[str], int] | None = None) -> None:
        """``hold(text)``: how many characters at the end of a stream's text to keep for the next
        batch (the redactor's ``unsafe_tail``: they may begin a secret the next output completes)."""
        self.sink, self.interval, self.max_bytes, self.max_batches = sink, interval, max_bytes, max_batches
        self.hold = hold
        self.clock = clock
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}
        self._pending = {"stdout": "", "stderr": ""}
        self._progress: dict[str, Any] | None = None
        self._last_sent = clock()
        self.bytes_sent = 0
        self.batches = 0
        self.truncated = False
        self._truncation_told = False

    def feed(self, stream: str, data: bytes) -> None:
        """A chunk read from ``stream`` ("stdout" or "stderr")."""
        if self.batches >= self.max_batches:
            return
        self._pending[stream] += self._decoders[stream].decode(data).replace("\x00", "\ufffd")  # PostgreSQL refuses NUL
        if stream == "stdout" and PROGRESS_PREFIX.strip() in self._pending["stdout"]:
            self._take_progress_lines()

    def tick(self) -> None:
        """Send a batch when one is due (call it often: each round of the command's watch loop)."""
        if self.clock() - self._last_sent >= self.interval:
            self._send(final=False)

    def close(self) -> None:
        """The command ended: send what is left."""
        for name, decoder in self._decoders.items():
            self._pending[name] += decoder.decode(b"", final=True).replace("\x00", "\ufffd")
        self._take_progress_lines(final=True)
        self._send(final=True)

    def _take_progress_lines(self, *, final: bool = False) -> None:
        text = self._pending["stdout"]
        lines = text.split("\n")
        carry = lines.pop()  # after the last newline: a partial line ("" when the text ends one)
        kept = []
        for line in lines:
            progress = parse_progress(line.rstrip("\r"))
            if progress is not None:
                self._progress = progress
            else:
                kept.append(line)
        if carry:
            progress = parse_progress(carry) if final else None
            if progress is not None:
                self._progress, carry = progress, ""
        self._pending["stdout"] = "\n".join(kept) + ("\n" if kept else "") + carry

    def _split_carry(self, text: str, final: bool) -> tuple[str, str]:
        """(what to send now, what to hold back): a partial last line that may become a progress line."""
        if final or not text or text.endswith("\n"):
            return text, ""
        head, _, tail = text.rpartition("\n")
        if len(tail) <= CARRY_MAX_CHARS and PROGRESS_PREFIX.startswith(tail[: len(PROGRESS_PREFIX)]):
            return (head + "\n" if head else ""), tail
        return text, ""

    def _send(self, *, final: bool) -> None:
        if self.batches >= self.max_batches:
            return
        batch: dict[str, Any] = {}
        for name in ("stdout", "stderr"):
            text, carry = self._split_carry(self._pending[name], final) if name == "stdout" else (
                self._pending[name], "")
            if self.hold is not None and not final and text:
                held = self.hold(text)
                if held:
                    text, carry = text[:-held], text[-held:] + carry
            self._pending[name] = carry
            if not text or self.truncated:
                continue
            room = self.max_bytes - self.bytes_sent
            encoded = text.encode()
            if len(encoded) > room:
                text = encoded[:room].decode("utf-8", "ignore")
                self.truncated = True
            self.bytes_sent += len(text.encode())
            if text:
                batch[name] = text
        if self._progress is not None:
            batch["progress"], self._progress = self._progress, None
        if self.truncated and not self._truncation_told:
            batch["truncated"] = True  # once: the live text stops here, the result has the rest
            self._truncation_told = True
        if not batch:
            return
        self._last_sent = self.clock()
        self.batches += 1
        batch["batch"] = self.batches
        try:
            self.sink(batch)
        except Exception:  # the live view is a courtesy: the command and its result go on without it
            log.exception("could not record a live output batch")
