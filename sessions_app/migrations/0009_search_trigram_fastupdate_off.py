"""The search's trigram indexes (0004) take new entries at once, not through a pending list.

A GIN index with ``fastupdate`` (PostgreSQL's default) queues new entries in a pending list that
every search reads through linearly and that only a vacuum (or the list's 4 MB limit) merges;
until then the planner also prices the index too dear to use it. The scale proof saw it: 10,000
sessions just written, and a one-ticket search scanned all 31,000 turns (25 ms) instead of
reading the index (0.1 ms). Titles and turn inputs are written once each and read by every
search, so each insert pays instead (about 0.15 ms per turn, measured on the same data).
"""

from typing import Any

from django.db import migrations

INDEXES = ["session_title_trgm", "turn_input_trgm"]


def _fastupdate(enabled: bool) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        for index in INDEXES:
            schema_editor.execute(f"ALTER INDEX IF EXISTS {index} SET (fastupdate = {'on' if enabled else 'off'})")
            if not enabled:  # what was queued before moves into the index now
                schema_editor.execute(f"SELECT gin_clean_pending_list('{index}'::regclass)")

    return run


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0008_ordering_by_column")]

    operations = [migrations.RunPython(_fastupdate(False), _fastupdate(True), elidable=False)]
