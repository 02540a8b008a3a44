"""Small template filters for the dashboard."""

from typing import Any

from django import template

from sessions_app.presenters import pretty_json as _pretty_json

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON as text; the template escapes it like any other string."""
    return _pretty_json(value)
