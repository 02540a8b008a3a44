"""Search by substring on PostgreSQL: pg_trgm GIN indexes on what the session search matches.

The session list's ``q`` matches ``title`` and every turn's ``input`` with ``icontains``, which
Django writes as ``UPPER(col::text) LIKE UPPER('%q%')``: a trigram index on ``UPPER(col)`` serves
that expression as written, so the search needs no second query language and gives the same
results on SQLite (which scans: its databases are small, single-user installs).
"""

from typing import Any

from django.db import migrations

CREATE = [
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE INDEX IF NOT EXISTS session_title_trgm ON sessions_app_agentsession USING gin (UPPER(title) gin_trgm_ops)",
    "CREATE INDEX IF NOT EXISTS turn_input_trgm ON sessions_app_turn USING gin (UPPER(input) gin_trgm_ops)",
]
# The extension stays: other databases objects may use it, and it is harmless.
DROP = ["DROP INDEX IF EXISTS session_title_trgm", "DROP INDEX IF EXISTS turn_input_trgm"]


def _on_postgresql(statements: list[str]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            for sql in statements:
                schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0003_session_newest_index")]

    operations = [migrations.RunPython(_on_postgresql(CREATE), _on_postgresql(DROP), elidable=False)]
