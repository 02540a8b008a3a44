"""Reads for tools_app."""

import threading
import time

from django.db.models import QuerySet

from .models import ToolDefinition


def tool_definition_get(name: str) -> ToolDefinition | None:
    """The ToolDefinition named ``name``, or None (the caller decides whether unknown is an error)."""
    return ToolDefinition.objects.filter(name=name).first()


def tool_definitions_enabled() -> QuerySet[ToolDefinition]:
    return ToolDefinition.objects.filter(enabled=True).order_by("name")


TOOL_CACHE_SECONDS = 2.0  # an admin's change to a tool shows within this
_cache: dict[str, object] = {"at": 0.0, "rows": {}}
_cache_lock = threading.Lock()


def tool_definitions_by_name() -> dict[str, ToolDefinition]:
    """Every ToolDefinition by name, cached briefly: the engine consults it several times a step."""
    with _cache_lock:
        if time.monotonic() - float(_cache["at"]) > TOOL_CACHE_SECONDS:  # type: ignore[arg-type]
            _cache["rows"] = {t.name: t for t in ToolDefinition.objects.all()}
            _cache["at"] = time.monotonic()
        return _cache["rows"]  # type: ignore[return-value]


def tool_definitions_cache_clear() -> None:
    with _cache_lock:
        _cache["at"] = 0.0
