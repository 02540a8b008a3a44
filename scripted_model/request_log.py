"""The request log: one entry per chat-completions request the server answered or failed on purpose.

It lets a test wait for a positive signal ("the model has answered twice") instead of sleeping:
in-process with `ScriptedModelServer.wait_for_requests`, over HTTP with `GET /_log?after=<seq>`,
or by reading the JSON lines written to `--request-log PATH`. Requests rejected before a reply
was planned (bad JSON, wrong API key, oversized body) have no script position and are not logged.
"""

import json
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

# Enough for a long test run; bounded so a server left running for weeks does not grow forever.
MAX_LOGGED_REQUESTS = 10_000
EXCERPT_CHARS = 200
SYSTEM_CHARS = 8000

ReplyKind = Literal["tool_calls", "text", "error"]


@dataclass(frozen=True)
class RequestLogEntry:
    """One answered request. Recorded when the answer is ready (after any scripted `sleep`) and
    before its first byte is written, so a client holding a response always finds its entry."""

    seq: int  # 1, 2, ... in the order the answers were ready
    received_at: float  # Unix time the request arrived
    finished_at: float  # Unix time the answer was ready
    model: str
    message_count: int
    last_user_message: str  # its first EXCERPT_CHARS characters
    position: int  # the script position answered (0 for a script that does not parse)
    kind: ReplyKind
    status: int  # 200, or the status of a scripted `error` (400 for a prompt over `--context-window`)
    prompt_tokens: int = 0  # the prompt's size as the server estimates it: characters / 4 (planner.prompt_tokens)
    purpose: str = "chat"  # "chat", or the agentops prompt it recognised: "compaction", "verification"
    system: str = ""  # the first system message, its first SYSTEM_CHARS characters (pinned context lives there)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class RequestLog:
    """Thread-safe: handler threads record while a test reads or waits."""

    def __init__(self, *, capacity: int = MAX_LOGGED_REQUESTS, path: str | Path | None = None) -> None:
        self._entries: deque[RequestLogEntry] = deque(maxlen=capacity)
        self._last_seq = 0
        self._changed = threading.Condition()
        # Opened here so a bad path fails at startup, before the server announces itself; line
        # buffered so a reader of the file sees each entry as soon as the answer is sent.
        self._file: TextIO | None = None
        if path is not None:
            self._file = Path(path).open("a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed by close())

    def record(
        self,
        *,
        received_at: float,
        model: str,
        message_count: int,
        last_user_message: str,
        position: int,
        kind: ReplyKind,
        status: int,
        prompt_tokens: int = 0,
        purpose: str = "chat",
        system: str = "",
    ) -> RequestLogEntry:
        # One lock for the sequence number, the deque and the file: the file's lines are in seq order.
        with self._changed:
            self._last_seq += 1
            entry = RequestLogEntry(
                seq=self._last_seq,
                received_at=received_at,
                finished_at=time.time(),
                model=model,
                message_count=message_count,
                last_user_message=last_user_message[:EXCERPT_CHARS],
                position=position,
                kind=kind,
                status=status,
                prompt_tokens=prompt_tokens,
                purpose=purpose,
                system=system[:SYSTEM_CHARS],
            )
            self._entries.append(entry)
            if self._file is not None:
                self._file.write(json.dumps(entry.as_json()) + "\n")
            self._changed.notify_all()
        return entry

    @property
    def last_seq(self) -> int:
        """The seq of the latest entry (0 before any): pass it as `after` to wait for what follows."""
        with self._changed:
            return self._last_seq

    def entries(self, *, after: int = 0) -> list[RequestLogEntry]:
        """A copy of the entries still held (the last `capacity`) whose seq is greater than `after`."""
        with self._changed:
            return [entry for entry in self._entries if entry.seq > after]

    def wait_for(self, count: int, *, after: int = 0, timeout: float = 10.0) -> list[RequestLogEntry]:
        """Block until `count` requests after seq `after` have been recorded, then return `entries(after=...)`.

        Raise TimeoutError when they have not all arrived within `timeout` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._last_seq - after >= count, timeout):
                raise TimeoutError(
                    f"{self._last_seq - after} of {count} chat-completions requests after seq {after} "
                    f"within {timeout} s"
                )
            return [entry for entry in self._entries if entry.seq > after]

    def close(self) -> None:
        """Close the file; later entries are kept in memory only (a handler may still be answering)."""
        with self._changed:
            if self._file is not None:
                self._file.close()
                self._file = None
