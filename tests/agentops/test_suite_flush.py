"""The suite's flush after a transactional test (tests/conftest.py ``_flush_by_delete``): a DELETE
of each table, in any order, empties the database as Django's TRUNCATE does."""

import pytest
from django.core.management import call_command
from django.core.management.color import no_style
from django.core.management.sql import sql_flush
from django.db import connection

from approvals_app import services as approvals
from sessions_app.models import AgentSession, Step, Turn
from tests import factories

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql",
                                reason="on SQLite Django's own flush is already a DELETE of each table")


@pytest.mark.django_db
def test_every_foreign_key_is_checked_at_commit_so_deletes_may_come_in_any_order() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT conrelid::regclass::text, conname FROM pg_constraint "
                       "WHERE contype = 'f' AND NOT (condeferrable AND condeferred)")
        immediate = cursor.fetchall()
        cursor.execute("SELECT count(*) FROM pg_constraint WHERE contype = 'f'")
        (total,) = cursor.fetchone()
    assert total > 50 and immediate == []


@pytest.mark.django_db(transaction=True)
def test_flush_deletes_every_row_of_every_table_without_truncate() -> None:
    # As Django's TransactionTestCase flushes after each test: sequences are not reset.
    statements = sql_flush(no_style(), connection, reset_sequences=False)
    assert statements and all(s.startswith("DELETE FROM ") for s in statements)
    assert "RESTART IDENTITY" in sql_flush(no_style(), connection, reset_sequences=True)[0]
    # Rows that reference each other across many tables, deleted parents first by table order.
    session = factories.session()
    step = factories.step(factories.turn(session), tool_name="run_command", arguments={"command": "ls"},
                          approval_mode="mutating")
    approvals.approval_request_create(step_id=step.id)
    call_command("flush", interactive=False, verbosity=0, reset_sequences=False,
                 inhibit_post_migrate=True)  # post_migrate would put content types and seeds back
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        counts = {}
        for table in tables:
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
    assert set(counts.values()) == {0}, {t: n for t, n in counts.items() if n}
    assert not AgentSession.objects.exists() and not Turn.objects.exists() and not Step.objects.exists()
