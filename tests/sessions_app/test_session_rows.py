"""A new session with its first turn is written in one statement on PostgreSQL (``rows.py``), with
the same rows as the ORM's inserts write elsewhere."""

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app.models import AgentSession, Event, SessionTitle, Turn
from sessions_app.services import session_create_with_turn
from tests import factories

pytestmark = pytest.mark.django_db

SKIP = {"id", "created_at", "updated_at", "last_event_at", "session_id", "idempotency_key"}


def _row(model: Any, pk: Any) -> dict[str, Any]:
    obj = model.objects.get(pk=pk)
    return {f.attname: getattr(obj, f.attname) for f in model._meta.concrete_fields if f.attname not in SKIP}


def _events(session_id: Any) -> list[dict[str, Any]]:
    rows = list(Event.objects.filter(session_id=session_id).order_by("seq").values("seq", "type", "payload", "turn_id"))
    return [{**row, "turn_id": row["turn_id"] is not None} for row in rows]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement write is PostgreSQL's")
def test_a_new_session_and_its_turn_are_one_statement_with_the_orms_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    agent, owner = factories.agent_profile(), factories.user()
    given: dict[str, Any] = {
        "agent": agent, "owner": owner, "input": "héllo ✓\nsecond line", "title": "Ticket 42: ünïcode",
        "pinned": {"requirements": ["keep it short"], "prohibitions": ["never delete"]},
        "budget": {"max_tool_calls": 7}, "metadata": {"case": [1, {"x": None}], "n": 1.5}}
    with CaptureQueriesContext(connection) as queries:
        session, turn = session_create_with_turn(**given, idempotency_key="a")
    writes = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert len(writes) == 1, writes
    assert not session._state.adding and not turn._state.adding

    monkeypatch.setattr(connection, "vendor", "elsewhere")  # the ORM's inserts, one per row set
    orm_session, orm_turn = session_create_with_turn(**given, idempotency_key="b")
    monkeypatch.undo()

    assert _row(AgentSession, session.pk) == _row(AgentSession, orm_session.pk)
    assert _row(Turn, turn.pk) == _row(Turn, orm_turn.pk)
    assert Turn.objects.get(pk=turn.pk).idempotency_key == "a"
    assert SessionTitle.objects.get(pk=session.pk).title == SessionTitle.objects.get(pk=orm_session.pk).title
    assert _events(session.pk) == _events(orm_session.pk)
    assert [e["type"] for e in _events(session.pk)] == ["session.created", "session.status_changed", "turn.queued"]
    stored = AgentSession.objects.get(pk=session.pk)
    assert stored.created_at == session.created_at  # microseconds kept, as the ORM stores them
    assert stored.last_seq == 3
