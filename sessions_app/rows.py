"""New rows of several tables in one PostgreSQL statement: each table's rows travel as one JSON
parameter, read back by ``jsonb_populate_recordset`` into the table's own row type.

The ORM inserts one statement per row set, each compiled in Python and a round trip of its own:
a new session with its first turn (session, title, turn, three events) took 1.3 ms of CPU and four
round trips, half of ``POST /api/sessions``'s view. The values are those the ORM would store
(``pre_save`` with ``add``: ``auto_now`` stamps, defaults), as PostgreSQL reads them back from
JSON: ids as text, times in full (Django's encoder cuts microseconds), JSON columns as JSON.
"""

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models

from agentops import jsontext

_ENCODER = DjangoJSONEncoder()


def _json_default(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return _ENCODER.default(value)


def _fields(model: type[models.Model], exclude: Sequence[str]) -> "list[models.Field[Any, Any]]":
    return [f for f in model._meta.concrete_fields if f.column not in exclude]


def rows_json(rows: Sequence[models.Model], *, exclude: Sequence[str] = ()) -> str:
    """Unsaved instances of one model as the JSON array ``jsonb_populate_recordset`` reads; a null
    JSON value stays SQL NULL. ``exclude``: columns the database fills (an identity)."""
    if not rows:
        return "[]"
    fields = _fields(type(rows[0]), exclude)
    return jsontext.dumps([{f.column: f.pre_save(row, True) for f in fields} for row in rows],
                          default=_json_default)


def insert_sql(model: type[models.Model], *, exclude: Sequence[str] = (), returning: str = "") -> str:
    """``INSERT … SELECT`` of ``rows_json``'s array, given as the statement's one parameter."""
    quote = connection.ops.quote_name
    table = model._meta.db_table
    columns = [quote(str(f.column)) for f in _fields(model, exclude)]
    sql = (f"INSERT INTO {quote(table)} ({', '.join(columns)}) SELECT {', '.join('r.' + c for c in columns)} "
           f"FROM jsonb_populate_recordset(NULL::{quote(table)}, %s::jsonb) AS r")
    return f"{sql} RETURNING {returning}" if returning else sql


def insert_together(groups: Sequence[tuple[Sequence[models.Model], Sequence[str]]]) -> None:
    """Insert each group of unsaved instances (one model per group, with the columns it leaves
    to the database), in one statement of data-modifying CTEs; then mark them saved. PostgreSQL
    only; Django's foreign keys are deferred, so the groups' order does not matter."""
    ctes, params = [], []
    for n, (rows, exclude) in enumerate(groups):
        if rows:
            ctes.append(f"w{n} AS ({insert_sql(type(rows[0]), exclude=exclude)})")
            params.append(rows_json(rows, exclude=exclude))
    if not ctes:
        return
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(ctes)} SELECT 1", params)
    for rows, _ in groups:
        for row in rows:
            if row.pk is not None:  # an identity left to the database stays unknown here
                row._state.adding = False
                row._state.db = connection.alias
