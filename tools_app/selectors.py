"""Reads for tools_app."""

from django.db.models import QuerySet

from .models import ToolDefinition


def tool_definition_get(name: str) -> ToolDefinition | None:
    """The ToolDefinition named ``name``, or None (the caller decides whether unknown is an error)."""
    return ToolDefinition.objects.filter(name=name).first()


def tool_definitions_enabled() -> QuerySet[ToolDefinition]:
    return ToolDefinition.objects.filter(enabled=True).order_by("name")
