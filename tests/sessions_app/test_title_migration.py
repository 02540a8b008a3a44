"""Migration 0010 copies the existing titles into the title search's table and, on PostgreSQL,
moves the trigram index there; migrating back puts the index on the session table again."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("sessions_app", "0009_search_trigram_fastupdate_off")]
AFTER = [("sessions_app", "0010_session_title_search")]


def _indexes(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", [table])
        return {name for (name,) in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_existing_titles_are_copied_and_the_index_moves_with_them() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    user = old.get_model("auth", "User").objects.create(username="veteran")
    team = old.get_model("agentops", "Team").objects.get_or_create(slug="default", defaults={"name": "Default"})[0]
    agent = old.get_model("sessions_app", "AgentProfile").objects.create(name="Old", slug="old", model="m", team=team)
    Session = old.get_model("sessions_app", "AgentSession")
    titled = Session.objects.create(agent=agent, owner=user, team=team, title="Invoice dispute, ACME")
    Session.objects.create(agent=agent, owner=user, team=team, title="")
    postgres = connection.vendor == "postgresql"
    if postgres:
        assert "session_title_trgm" in _indexes("sessions_app_agentsession")

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(AFTER)
    new = executor.loader.project_state(AFTER).apps
    rows = list(new.get_model("sessions_app", "SessionTitle").objects.values_list("session_id", "title"))
    assert rows == [(titled.pk, "Invoice dispute, ACME")]
    if postgres:
        assert "session_title_trgm" not in _indexes("sessions_app_agentsession")
        assert "session_title_search_trgm" in _indexes("sessions_app_sessiontitle")

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(BEFORE)
    if postgres:
        assert "session_title_trgm" in _indexes("sessions_app_agentsession")
    assert "sessions_app_sessiontitle" not in connection.introspection.table_names()

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
