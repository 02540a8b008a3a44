"""Secret references and redaction: pure functions over strings, no database, no keys.

A tool argument (an ``http_request`` header or URL), a tool's command environment or an MCP
server's headers name a secret as ``{{secret:NAME}}``. What is stored, hashed and shown is always
that reference; the vault (``vault_app.resolve``) swaps in the value inside the executing task
only, and everything the call produces goes through a ``Redactor`` before it is stored, which
replaces the value (and its base64 and hex forms) by ``[secret:NAME]``.
"""

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

SECRET_NAME = r"[a-z0-9][a-z0-9_.-]{0,99}"
SECRET_NAME_RE = re.compile(rf"^{SECRET_NAME}$")
# Any name is recognised as a reference (and refused when the vault has no such secret): a
# reference the vault did not recognise would otherwise go out as literal text.
REFERENCE_RE = re.compile(r"\{\{\s*secret:([A-Za-z0-9_.-]{1,100})\s*\}\}")
# Shorter values would be redacted inside unrelated text (a 3-letter secret is in every log).
MIN_VALUE_CHARS = 8
# A cut-off secret at the edge of a live-output batch: this many characters of a form are enough
# to redact it (the rest came, or comes, in the neighbouring batch).
PARTIAL_MIN_CHARS = 6


def references_in(value: Any) -> list[str]:
    """The secret names referenced anywhere in ``value`` (strings, dict keys and values, lists),
    sorted and unique."""
    found: set[str] = set()
    for text in _strings(value):
        found.update(REFERENCE_RE.findall(text))
    return sorted(found)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def substitute(value: Any, secrets: Mapping[str, str]) -> Any:
    """``value`` with every reference replaced by its secret (all must be in ``secrets``)."""
    if isinstance(value, str):
        return REFERENCE_RE.sub(lambda m: secrets[m.group(1)], value)
    if isinstance(value, Mapping):
        return {key: substitute(item, secrets) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [substitute(item, secrets) for item in value]
    return value


def _base64_cores(raw: bytes) -> set[str]:
    """The base64 text that encodes ``raw`` wherever it sits in a larger encoded stream.

    Encoded after 0, 1 or 2 other bytes, ``raw`` shifts against the 3-byte groups; the groups made
    of its bytes only encode the same way whatever comes before or after, so these cores are found
    in ``base64(x + raw + y)`` for any x and y (``echo $TOKEN | base64`` adds a newline).
    """
    cores: set[str] = set()
    for shift in range(3):
        padded = b"\0" * shift + raw
        first = (shift + 2) // 3  # the first group that holds none of the padding
        last = len(padded) // 3  # groups [first, last) are whole and made of raw's bytes only
        if last - first < 2:
            continue
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(padded).decode()
            cores.add(text[4 * first:4 * last])
    return cores


def secret_forms(value: str) -> set[str]:
    """Every form of ``value`` that is redacted: itself, URL-quoted, hex (either case), base64."""
    raw = value.encode()
    forms = {value, quote(value, safe=""), binascii.hexlify(raw).decode(), binascii.hexlify(raw).decode().upper()}
    padded = base64.b64encode(raw).decode()
    forms |= {padded, padded.rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("=")}
    forms |= _base64_cores(raw)
    return {form for form in forms if len(form) >= MIN_VALUE_CHARS}


class Redactor:
    """Replaces the secrets it was given, in any of their forms, by ``[secret:NAME]``."""

    def __init__(self, secrets: Mapping[str, str], *, retired: Iterable[tuple[str, str]] = ()) -> None:
        """``secrets``: name -> current value; ``retired``: (name, value) pairs a secret no longer
        has but that are still redacted (as ``[secret:NAME]``; a current value wins a clash)."""
        forms: dict[str, str] = {}
        for name, value in [*secrets.items(), *retired]:
            for form in secret_forms(value):
                forms.setdefault(form, name)
        self._forms = forms
        # Longest first: a value that contains another's form is replaced whole.
        ordered = sorted(forms, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(form) for form in ordered)) if ordered else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    @property
    def names(self) -> list[str]:
        return sorted(set(self._forms.values()))

    def text(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(lambda m: f"[secret:{self._forms[m.group(0)]}]", text)

    def edges(self, text: str) -> str:
        """``text`` redacted, and also a secret cut at its start or end (a live-output batch that
        ends inside a value; the next batch starts with its rest)."""
        text = self.text(text)
        if self._pattern is None:
            return text
        for form, name in self._forms.items():
            for size in range(min(len(form) - 1, len(text)), PARTIAL_MIN_CHARS - 1, -1):
                if text.endswith(form[:size]):
                    text = text[:-size] + f"[secret:{name}]"
                    break
            for size in range(min(len(form) - 1, len(text)), PARTIAL_MIN_CHARS - 1, -1):
                if text.startswith(form[-size:]):
                    text = f"[secret:{name}]" + text[size:]
                    break
        return text

    def value(self, value: Any, *, edges: bool = False) -> Any:
        """A JSON-like value with every string (keys too) redacted."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.edges(value) if edges else self.text(value)
        if isinstance(value, Mapping):
            return {self.text(str(key)): self.value(item, edges=edges) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(item, edges=edges) for item in value]
        return value

    def data(self, raw: bytes) -> bytes:
        """Bytes (an artifact's content) redacted; bytes that are not UTF-8 are matched as Latin-1,
        which maps every byte to one character and back."""
        if self._pattern is None:
            return raw
        try:
            return self.text(raw.decode("utf-8")).encode("utf-8")
        except UnicodeDecodeError:
            return self.text(raw.decode("latin-1")).encode("latin-1", "replace")
