"""The title search moves off the session row: a table of titles (``SessionTitle``) with the
trigram index, filled from the sessions that have a title; on PostgreSQL the session table's own
trigram index on the title goes (see ``SessionTitle``: it was written again with every event).
"""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

COPY = ("INSERT INTO sessions_app_sessiontitle (session_id, title) "
        "SELECT id, title FROM sessions_app_agentsession WHERE title <> ''")
# As migrations 0004 and 0009 made the one on the session table: UPPER(title) is what icontains
# compares, and no pending list (each search would read through it).
CREATE = ("CREATE INDEX IF NOT EXISTS session_title_search_trgm ON sessions_app_sessiontitle "
          "USING gin (UPPER(title) gin_trgm_ops) WITH (fastupdate = off)")
DROP_OLD = "DROP INDEX IF EXISTS session_title_trgm"
RESTORE_OLD = ("CREATE INDEX IF NOT EXISTS session_title_trgm ON sessions_app_agentsession "
               "USING gin (UPPER(title) gin_trgm_ops) WITH (fastupdate = off)")


def _forward(apps: Any, schema_editor: Any) -> None:
    schema_editor.execute(COPY)
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)
        schema_editor.execute(DROP_OLD)


def _backward(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(RESTORE_OLD)  # the table and its index go with the model's removal


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0009_search_trigram_fastupdate_off")]

    operations = [
        migrations.CreateModel(
            name="SessionTitle",
            fields=[
                ("session", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True,
                                                 related_name="search_title", serialize=False,
                                                 to="sessions_app.agentsession")),
                ("title", models.CharField(max_length=200)),
            ],
        ),
        migrations.RunPython(_forward, _backward, elidable=False),
    ]
