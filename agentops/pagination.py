"""Cursor pagination for the list APIs: newest first, by ``(created_at, pk)``.

Like HackSoft's ``get_paginated_response``: the API hands over a filtered queryset and gets the
page body back. The cursor is opaque to clients (base64url of ``[created_at, pk]``); a keyset
walk neither skips nor repeats a row when rows share a ``created_at``. A cursor the server did
not make is refused with 400 ``invalid_arguments``, never a 500.
"""

import base64
import binascii
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db.models import Model, Q, QuerySet

from agentops.domain import InvalidArguments

M = TypeVar("M", bound=Model)

MAX_LIMIT = 200
MAX_CURSOR_CHARS = 200  # ours are about 90
BIGINT = 2**63


class InvalidCursor(InvalidArguments):
    """The cursor is not one this server gave out."""

    status = 400


def cursor_encode(row: Model) -> str:
    raw = json.dumps([row.created_at.isoformat(), str(row.pk)], separators=(",", ":"))  # type: ignore[attr-defined]
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def cursor_decode(cursor: str, model: type[Model]) -> tuple[datetime, Any]:
    """(created_at, pk) of a cursor; InvalidCursor for anything else."""
    try:
        if len(cursor) > MAX_CURSOR_CHARS or not cursor.isascii():
            raise ValueError("not a cursor")
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
        created_text, pk_text = json.loads(raw)
        created = datetime.fromisoformat(created_text)
        if created.tzinfo is None:
            raise ValueError("naive datetime")
        created = created.astimezone(UTC)
        pk = model._meta.pk.to_python(pk_text)
        if pk is None:  # to_python lets null through; a filter on it raises (a 500 before)
            raise ValueError("no pk")
        if isinstance(pk, int) and not -BIGINT <= pk < BIGINT:
            raise ValueError("pk out of range")
    except (ValueError, TypeError, OverflowError, binascii.Error, ValidationError) as exc:
        raise InvalidCursor("Invalid cursor", details={"field": "cursor"}) from exc
    return created, pk


def get_paginated_response(*, queryset: "QuerySet[M]", cursor: str | None, limit: int,
                           serialize: Callable[[M], Any]) -> dict[str, Any]:
    """One page of ``queryset``, newest first: ``{"items": [...], "next_cursor": str | None}``.

    One query. ``limit`` is clamped to 1..MAX_LIMIT.
    """
    limit = max(1, min(limit, MAX_LIMIT))
    qs = queryset.order_by("-created_at", "-pk")
    if cursor:
        created, pk = cursor_decode(cursor, queryset.model)
        qs = qs.filter(Q(created_at__lt=created) | Q(created_at=created, pk__lt=pk))
    rows = list(qs[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return {"items": [serialize(row) for row in rows], "next_cursor": cursor_encode(rows[-1]) if more else None}
