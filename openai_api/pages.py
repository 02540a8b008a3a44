"""Pages of the Agents API's wire: the keyset CursorPage of a queryset, and a page of a list."""

from typing import Any

from django.db.models import Q, QuerySet

from openai_api import parse


def page(qs: QuerySet[Any], *, after_row: Any, order: str, limit: int, fields: tuple[str, str],
          serialize: Any = None, serialize_rows: Any = None) -> dict[str, Any]:
    """A CursorPage: ``{"data", "has_more", "first_id", "last_id"}``, keyset on ``fields``;
    ``serialize`` shapes one row, or ``serialize_rows`` the whole page (bulk reads)."""
    desc = order == "desc"
    first, second = fields
    if after_row is not None:
        v1, v2 = getattr(after_row, first), getattr(after_row, second)
        op = "lt" if desc else "gt"
        qs = qs.filter(Q(**{f"{first}__{op}": v1}) | Q(**{first: v1, f"{second}__{op}": v2}))
    qs = qs.order_by(*(f"-{f}" if desc else f for f in fields))
    rows = list(qs[: limit + 1])
    data = serialize_rows(rows[:limit]) if serialize_rows else [serialize(row) for row in rows[:limit]]
    return {"object": "list", "data": data, "has_more": len(rows) > limit,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def list_page(items: list[dict[str, Any]], *, after: str | None, order: str, limit: int) -> dict[str, Any]:
    """A page of a list built in memory (items in ascending order), cursor = an item id."""
    items = list(reversed(items)) if order == "desc" else items
    if after:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise parse.WireError(f"Invalid 'after': no item {after!r} in this list.", param="after")
        items = items[ids.index(after) + 1:]
    data = items[:limit]
    return {"object": "list", "data": data, "has_more": len(items) > limit,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def empty_page() -> dict[str, Any]:
    return {"object": "list", "data": [], "has_more": False, "first_id": None, "last_id": None}


