"""Small template filters for the dashboard."""

import unicodedata
import uuid
from typing import Any

from django import template
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince
from django.utils.timezone import template_localtime  # type: ignore[attr-defined]  # not in the stubs

from approvals_app.models import ApprovalStatus
from sessions_app.markdown import markdown_html
from sessions_app.models import SessionStatus, StepStatus, TurnStatus
from sessions_app.presenters import pretty_json as _pretty_json

register = template.Library()


DECIDED_LABELS = {"approve": "approved", "reject": "rejected", "retry": "retry approved", "mark_done": "marked done",
                  "fail": "failed"}


@register.filter
def decided(decision: Any) -> str:
    """A reviewer's decision as what happened to the request ("approve" → "approved")."""
    return DECIDED_LABELS.get(str(decision or ""), str(decision or ""))


@register.simple_tag
def submission_key() -> SafeString:
    """A hidden field naming this rendering of a form: a second post of it (a double click)
    does nothing more than the first (``agentops.idempotency``, pages)."""
    return format_html('<input type="hidden" name="submission_key" value="{}">', uuid.uuid4().hex)

# One label per status value, from the models' choices. A value shared by several models has the
# same label in each (awaiting_approval, failed, cancelled, …).
STATUS_LABELS: dict[str, str] = {str(value): str(label) for choices in (SessionStatus, TurnStatus, StepStatus,
                                                                        ApprovalStatus)
                                 for value, label in choices.choices}


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON as text; the template escapes it like any other string."""
    return _pretty_json(value)


@register.filter
def status_label(value: Any) -> str:
    """The human label of a session, turn, step or approval status; an unknown value as is."""
    return STATUS_LABELS.get(str(value), str(value))


# Tags, not included templates: a status badge and a relative time appear on every row of a list and
# several times on every step card, live fragments included, and an {% include %} costs a template
# lookup and a context push each time (71 of them on the session list at 10,000 sessions).

@register.simple_tag
def badge(status: Any) -> SafeString:
    """A status badge: ``<span class="badge s-<status>">label</span>``."""
    return format_html('<span class="badge s-{}">{}</span>', status, status_label(status))


@register.simple_tag
def reltime(when: Any) -> SafeString:
    """A time as "3 minutes ago", with the exact time in its ``datetime`` and ``title`` (the
    current time zone's); an em dash when there is none."""
    if not when:
        return mark_safe("—")
    local = template_localtime(when)
    # date_format(local, "c") and date_format(local, "Y-m-d H:i:s e"), written out: Django's
    # formatter took 29 of this tag's 44 µs, and a backlog or a session page shows it on every card.
    exact = f"{local.year:04d}-{local.month:02d}-{local.day:02d} {local:%H:%M:%S} {local.tzname() or ''}"
    return format_html('<time datetime="{}" data-rel title="{}">{} ago</time>', local.isoformat(), exact,
                       timesince(when))


@register.filter
def markdown(value: Any) -> SafeString:
    """A final answer's Markdown as sanitised HTML (``sessions_app.markdown``: nh3 cleans it, so
    marking it safe is sound)."""
    return mark_safe(markdown_html(str(value or "")))  # noqa: S308 - sanitised by nh3 just above
def _is_hidden(char: str) -> bool:
    """A character a reviewer would not see as what it is: controls, format characters (the bidi
    overrides and isolates that reorder a command on screen, zero-width joiners and spaces, the
    BOM), separators other than the plain space, private-use and surrogate code points."""
    if char in "\n\t":
        return False
    category = unicodedata.category(char)
    return category in ("Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp") or (category == "Zs" and char != " ")


@register.filter
def reveal_hidden(value: Any) -> SafeString:
    """The text escaped, each hidden character shown as a visible ``⟨U+202E⟩`` marker (with its
    name as a tooltip): what the reviewer reads is what runs, in the order it runs."""
    parts = []
    for char in str(value):
        if _is_hidden(char):
            code = f"U+{ord(char):04X}"
            name = unicodedata.name(char, "unnamed character")
            parts.append(f'<span class="hidden-char" title="{escape(name)}">⟨{code}⟩</span>')
        else:
            parts.append(escape(char))
    return mark_safe("".join(parts))  # noqa: S308 - every piece of the input is escaped above


@register.filter
def has_hidden(value: Any) -> bool:
    return any(_is_hidden(char) for char in str(value))
