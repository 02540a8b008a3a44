"""Small template filters for the dashboard."""

from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe

from approvals_app.models import ApprovalStatus
from sessions_app.markdown import markdown_html
from sessions_app.models import SessionStatus, StepStatus, TurnStatus
from sessions_app.presenters import pretty_json as _pretty_json

register = template.Library()

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


@register.filter
def markdown(value: Any) -> SafeString:
    """A final answer's Markdown as sanitised HTML (``sessions_app.markdown``: nh3 cleans it, so
    marking it safe is sound)."""
    return mark_safe(markdown_html(str(value or "")))  # noqa: S308 - sanitised by nh3 just above
