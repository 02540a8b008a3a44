"""The session search reads its trigram indexes on PostgreSQL, also right after a burst of writes.

The scale proof found it: with GIN's default pending list (``fastupdate``), turns written since
the last vacuum sat outside the index, and the planner scanned every turn (25 ms at 31,000 turns)
instead of reading the index (0.1 ms). Migration 0009 turns the pending list off.
"""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from sessions_app.models import AgentProfile, SessionTitle, Turn
from sessions_app.selectors import sessions_list
from tests import factories

pytestmark = [pytest.mark.django_db,
              pytest.mark.skipif(connection.vendor != "postgresql", reason="trigram indexes exist on PostgreSQL only")]


def _plan(sql: str, params: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_a_search_right_after_many_new_turns_reads_the_trigram_index(operator: User, agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator, title="Bulk")
    Turn.objects.bulk_create(Turn(session=session, index=i, input=f"ticket T{i:05d} about an invoice")
                             for i in range(1, 4001))
    factories.turn(factories.session(agent=agent, owner=operator, title="Other"), input="ticket T99999-2")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE sessions_app_turn")  # what autovacuum's analyze would know; no VACUUM

    inputs = Turn.objects.filter(input__icontains="T99999-2").order_by().values("session_id")
    plan = _plan(*inputs.query.sql_with_params())
    assert "turn_input_trgm" in plan, plan
    assert [s.title for s in sessions_list(user=operator, q="t99999-2")] == ["Other"]


def test_titles_are_searched_in_a_table_of_their_own_through_its_trigram_index(operator: User,
                                                                              agent: AgentProfile) -> None:
    for i in range(20):
        factories.session(agent=agent, owner=operator, title=f"Refund request {i:04d}")
    factories.session(agent=agent, owner=operator, title="Chargeback for order Z-7781")
    factories.session(agent=agent, owner=operator)  # no title: no row to search
    titles = SessionTitle.objects.filter(title__icontains="z-7781").order_by().values("session_id")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a small table: is the index there to serve it?
    assert "session_title_search_trgm" in _plan(*titles.query.sql_with_params())
    assert [s.title for s in sessions_list(user=operator, q="z-7781")] == ["Chargeback for order Z-7781"]
    assert SessionTitle.objects.count() == 21


def test_the_session_row_which_every_event_rewrites_carries_no_trigram_index() -> None:
    """Each event rewrites the session row (its seq, its counters); an index on the row is written
    again whenever that is not a HOT update, and the title's trigrams cost ~10 KB of WAL each time."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'sessions_app_agentsession'")
        indexes = dict(cursor.fetchall())
    assert indexes and not [name for name, definition in indexes.items() if "gin" in definition.lower()], indexes
