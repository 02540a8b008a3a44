"""Secret references and redaction: pure functions over strings, no database, no keys.

A tool argument (an ``http_request`` header or URL), a tool's command environment or an MCP
server's headers name a secret as ``{{secret:NAME}}``. What is stored, hashed and shown is always
that reference; the vault (``vault_app.resolve``) swaps in the value inside the executing task
only, and everything the call produces goes through a ``Redactor`` before it is stored, which
replaces the value (and its base64, base32, hex and URL-quoted forms, also wrapped or spaced) by
``[secret:NAME]``.
"""

import base64
import binascii
import re
import string
from collections.abc import Callable, Iterable, Mapping
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


def _cores(raw: bytes, encode: Callable[[bytes], bytes], group: int, chars: int) -> set[str]:
    """The text that encodes ``raw`` wherever it sits in a larger encoded stream.

    An encoding works on groups of ``group`` bytes (base64: 3, base32: 5), each written as ``chars``
    characters. Encoded after 0..group-1 other bytes, ``raw`` shifts against the groups; the groups
    made of its bytes only encode the same way whatever comes before or after, so these cores are
    found in ``encode(x + raw + y)`` for any x and y (``echo $TOKEN | base64`` adds a newline).
    """
    cores: set[str] = set()
    for shift in range(group):
        padded = b"\0" * shift + raw
        first = (shift + group - 1) // group  # the first group that holds none of the padding
        last = len(padded) // group  # groups [first, last) are whole and made of raw's bytes only
        if last - first < 2:
            continue
        cores.add(encode(padded).decode()[chars * first:chars * last])
    return cores


def secret_forms(value: str) -> set[str]:
    """Every form of ``value`` that is redacted: itself, URL-quoted, hex (either case), base64
    (standard and URL-safe) and base32, whole or inside a longer encoding."""
    return _plain_forms(value) | _encoded_forms(value)


def _plain_forms(value: str) -> set[str]:
    """The value as written (and URL-quoted): matched ignoring ASCII case."""
    return {form for form in (value, quote(value, safe="")) if len(form) >= MIN_VALUE_CHARS}


def _encoded_forms(value: str) -> set[str]:
    """Its encodings: matched as they are (a case change makes another encoding)."""
    raw = value.encode()
    forms = {binascii.hexlify(raw).decode(), binascii.hexlify(raw).decode().upper()}
    padded = base64.b64encode(raw).decode()
    forms |= {padded, padded.rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("=")}
    forms |= {base64.b32encode(raw).decode(), base64.b32encode(raw).decode().rstrip("=")}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        forms |= _cores(raw, encode, 3, 4)
    forms |= _cores(raw, base64.b32encode, 5, 8)
    return {form for form in forms if len(form) >= MIN_VALUE_CHARS}


class Redactor:
    """Replaces the secrets it was given, in any of their forms, by ``[secret:NAME]``.

    Two passes over a text: the forms as they are, then the forms with the whitespace around and
    inside them ignored, which finds an encoding a tool wrapped or spaced (GNU ``base64`` and
    ``base32`` wrap at 76 columns, ``xxd -p`` at 60, ``od -An -tx1`` spaces every byte; CRLF too).
    Each form is looked up with ``str.find`` (C speed; one alternation regex of a few hundred forms
    tried them one by one at every position, several times slower); overlapping matches are
    replaced as one. The value itself (and URL-quoted) is matched ignoring ASCII case: a tool may
    change it (a URL's host is lower-cased by every parser and quoted so in errors), and redacting
    a look-alike costs nothing. Its encodings are matched as they are (hex in both cases): a case
    change makes another encoding, and looking for them in the folded text too cost 10-30 % more.
    The old alternation regex with ``re.IGNORECASE`` took ~1.8 s on 1 MB with 20 secrets; this ~0.1 s.
    """

    def __init__(self, secrets: Mapping[str, str], *, retired: Iterable[tuple[str, str]] = ()) -> None:
        """``secrets``: name -> current value; ``retired``: (name, value) pairs a secret no longer
        has but that are still redacted (as ``[secret:NAME]``; a current value wins a clash)."""
        exact: dict[str, str] = {}
        caseless: dict[str, str] = {}  # folded form -> name
        for name, value in [*secrets.items(), *retired]:
            for form in _plain_forms(value):
                caseless.setdefault(_fold(form), name)
            for form in _encoded_forms(value):
                exact.setdefault(form, name)
        # Longest first: of two forms found at one place, the longer names the span.
        self._exact = dict(sorted(exact.items(), key=lambda item: -len(item[0])))
        self._caseless = dict(sorted(caseless.items(), key=lambda item: -len(item[0])))
        self._squeezed = [_squeezed(self._exact, folded=False), _squeezed(self._caseless, folded=True)]
        self._spread: dict[str, re.Pattern[str]] = {}

    def __bool__(self) -> bool:
        return bool(self._exact or self._caseless)

    @property
    def names(self) -> list[str]:
        return sorted(set(self._exact.values()) | set(self._caseless.values()))

    def text(self, text: str) -> str:
        if not self or not text:
            return text
        spans = _found(text, self._exact) + _found(_fold(text), self._caseless)
        return self._spread_out(_replaced(text, spans))

    def _spread_out(self, text: str) -> str:
        """``text`` with the forms that whitespace splits redacted (the second pass)."""
        squeezed = "".join(text.split())
        if len(squeezed) == len(text):
            return text  # no whitespace: the first pass saw everything
        spans = []
        for haystack, needles, folded in ((squeezed, self._squeezed[0], False),
                                          (_fold(squeezed), self._squeezed[1], True)):
            for needle, name in needles.items():
                if needle in haystack:
                    within = _fold(text) if folded else text
                    spans += [(m.start(), m.end(), name) for m in self._spread_pattern(needle).finditer(within)]
        return _replaced(text, spans)

    def _spread_pattern(self, needle: str) -> re.Pattern[str]:
        pattern = self._spread.get(needle)
        if pattern is None:
            pattern = self._spread[needle] = re.compile(r"\s*".join(re.escape(char) for char in needle))
        return pattern

    def edges(self, text: str) -> str:
        """``text`` redacted, and also a secret cut at its start or end (a live-output batch that
        ends inside a value; the next batch starts with its rest)."""
        text = self.text(text)
        forms = [(form, name, False) for form, name in self._exact.items()]
        for form, name, folded in forms + [(form, name, True) for form, name in self._caseless.items()]:
            for size in range(min(len(form) - 1, len(text)), PARTIAL_MIN_CHARS - 1, -1):
                end = text[-size:]
                if (_fold(end) if folded else end) == form[:size]:
                    text = text[:-size] + f"[secret:{name}]"
                    break
            for size in range(min(len(form) - 1, len(text)), PARTIAL_MIN_CHARS - 1, -1):
                start = text[:size]
                if (_fold(start) if folded else start) == form[-size:]:
                    text = f"[secret:{name}]" + text[size:]
                    break
        return text

    def unsafe_tail(self, text: str) -> int:
        """How many characters at the end of ``text`` could be the start of a secret's form that
        more of the stream completes (whitespace inside it ignored, as the second pass does). Live
        output holds them back until it knows: a command printing a value four characters a second
        sent it in pieces, one batch each, and no piece was a form (a secrets audit). A cut never
        falls inside a whole form either (a value's last letter may begin another form)."""
        held = self._prefix_tail(text)
        if not held:
            return 0
        cut = len(text) - held
        for start, end, _ in _found(text, self._exact) + _found(_fold(text), self._caseless):
            if start < cut < end:
                return self._prefix_tail(text[end:]) if end < len(text) else 0
        return held

    def _prefix_tail(self, text: str) -> int:
        if not self or not text:
            return 0
        tail: list[str] = []  # the last non-whitespace characters, newest first, with their positions
        at = len(text)
        widest = max(len(needle) for needles in self._squeezed for needle in needles) if any(self._squeezed) else 0
        while at > 0 and len(tail) < widest:
            at -= 1
            if not text[at].isspace():
                tail.append(text[at])
        if not tail:
            return 0
        positions = [i for i in range(len(text) - 1, at - 1, -1) if not text[i].isspace()]
        squeezed = "".join(reversed(tail))
        longest = 0
        for needles, folded in ((self._squeezed[0], False), (self._squeezed[1], True)):
            haystack = _fold(squeezed) if folded else squeezed
            last = haystack[-1]
            for needle in needles:
                k = needle.rfind(last, 0, min(len(needle) - 1, len(haystack)))
                while k >= longest:
                    if haystack.endswith(needle[:k + 1]):
                        longest = k + 1
                        break
                    k = needle.rfind(last, 0, k)
        return len(text) - positions[longest - 1] if longest else 0

    def value(self, value: Any, *, edges: bool = False) -> Any:
        """A JSON-like value with every string (keys too) redacted."""
        if not self:
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
        if not self:
            return raw
        try:
            return self.text(raw.decode("utf-8")).encode("utf-8")
        except UnicodeDecodeError:
            return self.text(raw.decode("latin-1")).encode("latin-1", "replace")


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _fold(text: str) -> str:
    """``text`` with ASCII letters lower-cased and nothing else changed, so that an index into it is
    an index into ``text`` (``str.lower`` may change the length of some non-ASCII text)."""
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


def _found(haystack: str, needles: Mapping[str, str]) -> list[tuple[int, int, str]]:
    """(start, end, name) of every occurrence of every needle (overlapping ones too)."""
    spans = []
    for needle, name in needles.items():
        at = haystack.find(needle)
        while at != -1:
            spans.append((at, at + len(needle), name))
            at = haystack.find(needle, at + 1)
    return spans


def _squeezed(forms: Mapping[str, str], *, folded: bool) -> dict[str, str]:
    """The forms without their whitespace (a value may hold spaces), for the second pass."""
    squeezed: dict[str, str] = {}
    for form, name in forms.items():
        bare = "".join(form.split())
        if len(bare) >= MIN_VALUE_CHARS:
            squeezed.setdefault(_fold(bare) if folded else bare, name)
    return squeezed


def _replaced(text: str, spans: list[tuple[int, int, str]]) -> str:
    """``text`` with each span (start, end, name) replaced by ``[secret:NAME]``; overlapping spans
    become one (named after the first: a value that holds another's form is replaced whole)."""
    if not spans:
        return text
    spans.sort(key=lambda span: (span[0], -span[1]))
    out, done = [], 0
    start, end, name = spans[0]
    for s_start, s_end, s_name in spans[1:]:
        if s_start < end:
            end = max(end, s_end)
            continue
        out += [text[done:start], f"[secret:{name}]"]
        done, (start, end, name) = end, (s_start, s_end, s_name)
    out += [text[done:start], f"[secret:{name}]", text[end:]]
    return "".join(out)
