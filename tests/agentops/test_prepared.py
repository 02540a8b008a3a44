"""agentops.prepared: a hot queryset compiled once returns what the ORM returns."""

import uuid
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.sql.compiler import SQLCompiler
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from agentops.models import ApiToken
from agentops.prepared import Prepared
from agentops.selectors import api_token_get, token_sha256
from sessions_app.engine import tick
from sessions_app.locks import _LOCKED_WITH_AGENT
from sessions_app.models import AgentSession, Step, Turn
from tests import factories
from tests.helpers import api_token

pytestmark = pytest.mark.django_db


def fields(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def count_compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, the model of each queryset the ORM compiles to SQL, in order."""
    compiled: list[str] = []
    real_as_sql = SQLCompiler.as_sql

    def counted_as_sql(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
        compiled.append(self.query.model.__name__ if self.query.model else "?")
        return real_as_sql(self, *args, **kwargs)

    monkeypatch.setattr(SQLCompiler, "as_sql", counted_as_sql)
    return compiled


def test_prepared_queries_return_what_the_orm_returns_without_compiling_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = [factories.session(title=f"s{n}", metadata={"n": n, "nested": [1, {"a": None}]}) for n in range(3)]
    for session in sessions:
        turn = factories.turn(session)
        for index, kind in enumerate(["model", "tool", "model", "tool", "tool"]):
            Step.objects.create(session=session, turn=turn, index=index + 1, kind=kind, tool_name="list_files",
                                arguments={"path": f"p{index}"}, message={"content": "é ✓"})
    prepared_turn = Prepared(lambda pk, session_id: Turn.objects.filter(pk=pk, session_id=session_id))
    with transaction.atomic():
        _LOCKED_WITH_AGENT.first(pk=sessions[0].pk)  # compiled here, once
    tick._LATEST_STEPS.all(turn_id=uuid.uuid4())
    prepared_turn.all(pk=uuid.uuid4(), session_id=sessions[0].pk)
    compiled = count_compiles(monkeypatch)
    for session in sessions:
        turn = Turn.objects.get(session=session)
        compiled.clear()
        with transaction.atomic():
            locked = _LOCKED_WITH_AGENT.first(pk=session.pk)
        steps = tick._LATEST_STEPS.all(turn_id=turn.pk)
        got_turn = prepared_turn.first(pk=turn.pk, session_id=session.pk)
        if connection.vendor == "postgresql":
            assert compiled == []
        assert locked is not None and got_turn is not None
        assert fields(locked) == fields(AgentSession.objects.get(pk=session.pk))
        assert fields(locked.agent) == fields(session.agent)  # select_related, populated
        assert "agent" in locked._state.fields_cache
        assert [fields(s) for s in steps] == [fields(s) for s in tick._latest_steps_query(turn.pk)]
        assert [s.index for s in steps] == [3, 4, 5]  # the newest model step and the tools after it
        assert fields(got_turn) == fields(turn)
        assert not got_turn._state.adding and got_turn._state.db == "default"
    assert prepared_turn.first(pk=turn.pk, session_id=sessions[0].pk) is None  # another session's turn


def test_prepared_refuses_what_it_cannot_prepare() -> None:
    session = factories.session()
    if connection.vendor == "postgresql":
        with pytest.raises(TypeError, match="not one of"):  # a value the build makes up is no constant
            Prepared(lambda pk: AgentSession.objects.filter(pk=pk, title=uuid.uuid4().hex)).all(pk=session.pk)
        with pytest.raises(TypeError, match="do not reach"):
            Prepared(lambda pk, ignored: AgentSession.objects.filter(pk=pk)).all(pk=session.pk, ignored=5)
    # None (IS NULL) changes the query: built and run by the ORM as usual
    assert Prepared(lambda title: AgentSession.objects.filter(title=title)).all(title=None) == []


@pytest.mark.django_db(transaction=True)
def test_a_prepared_lock_outside_a_transaction_is_refused() -> None:
    """As the ORM refuses it: where the database has SELECT … FOR UPDATE (SQLite has none, and
    Django runs the query without the lock there)."""
    session = factories.session()
    with transaction.atomic():
        assert _LOCKED_WITH_AGENT.first(pk=session.pk) is not None
    if not connection.features.has_select_for_update:
        assert _LOCKED_WITH_AGENT.first(pk=session.pk) is not None
        return
    with pytest.raises(TransactionManagementError):
        _LOCKED_WITH_AGENT.first(pk=session.pk)


def test_api_token_lookup_is_compiled_once_and_refuses_what_the_orm_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    live, revoked, inactive = (factories.user(name) for name in ("live", "gone", "asleep"))
    tokens = {user.username: api_token(user) for user in (live, revoked, inactive)}
    ApiToken.objects.filter(token_sha256=token_sha256(tokens["gone"])).update(revoked_at=timezone.now())
    inactive.is_active = False
    inactive.save(update_fields=["is_active"])
    api_token_get(tokens["live"])  # compiled here, once
    compiled = count_compiles(monkeypatch)
    row = api_token_get(tokens["live"])
    refused = [api_token_get(tokens["gone"]), api_token_get(tokens["asleep"]), api_token_get("aop_" + "x" * 40)]
    if connection.vendor == "postgresql":
        assert compiled == []
    assert row is not None and row.user.username == "live" and "user" in row._state.fields_cache
    assert fields(row) == fields(ApiToken.objects.get(token_sha256=token_sha256(tokens["live"])))
    assert fields(row.user) == fields(live)
    assert refused == [None, None, None]


def test_any_of_a_list_is_one_statement_for_any_number_of_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """``pk__any=[…]`` matches as ``pk__in`` does; prepared, two lists of different lengths run the
    same compiled statement (on PostgreSQL: one array parameter)."""
    sessions = [factories.session(title=f"any{n}") for n in range(4)]
    by_any = Prepared(lambda ids: AgentSession.objects.filter(pk__any=ids).order_by())
    ids = [s.pk for s in sessions]
    assert {s.pk for s in AgentSession.objects.filter(pk__any=ids[:2])} == set(ids[:2])  # the ORM, unprepared
    assert list(AgentSession.objects.filter(pk__any=[])) == []
    by_any.all(ids=[uuid.uuid4()])
    compiled = count_compiles(monkeypatch)
    assert {s.pk for s in by_any.all(ids=ids[:1])} == set(ids[:1])
    got = by_any.all(ids=[*ids[1:], uuid.uuid4()])
    if connection.vendor == "postgresql":
        assert compiled == []
    assert sorted((fields(s) for s in got), key=lambda f: f["title"]) == [
        fields(s) for s in AgentSession.objects.filter(pk__in=ids[1:]).order_by("title")]
    assert by_any.all(ids=[]) == []  # an empty list is not prepared: the ORM answers it
    turn = factories.turn(sessions[0])
    by_session = Prepared(lambda ids: Turn.objects.filter(session_id__any=ids))
    assert [t.pk for t in by_session.all(ids=[sessions[0].pk, sessions[1].pk])] == [turn.pk]
    assert [t.pk for t in Turn.objects.filter(session__any=[sessions[0].pk])] == [turn.pk]


def test_reads_together_return_what_each_returns_alone(django_assert_num_queries: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``all_together``: several prepared reads in one round trip (psycopg's pipeline on
    PostgreSQL), each answering as ``all()`` does, including one that cannot be prepared."""
    from agentops.prepared import all_together

    session = factories.session(title="together")
    turn = factories.turn(session)
    step = Step.objects.create(session=session, turn=turn, index=1, kind="tool", tool_name="list_files",
                               arguments={"path": "é"}, result={"output": ["a", {"b": None}]})
    sessions = Prepared(lambda ids: AgentSession.objects.filter(pk__any=ids).select_related("agent").order_by())
    steps = Prepared(lambda turn_id: Step.objects.filter(turn_id=turn_id).order_by("index"))
    titles = Prepared(lambda title: AgentSession.objects.filter(title=title))
    alone: list[list[Any]] = [sessions.all(ids=[session.pk]), steps.all(turn_id=turn.pk), titles.all(title=None)]
    pipelines: list[int] = []
    if connection.vendor == "postgresql":  # the two prepared reads go out in one pipeline
        connection.ensure_connection()
        real = type(connection.connection).pipeline

        def counted(self: Any) -> Any:
            pipelines.append(1)
            return real(self)

        monkeypatch.setattr(type(connection.connection), "pipeline", counted)
    with django_assert_num_queries(3):
        got = all_together((sessions, {"ids": [session.pk]}), (steps, {"turn_id": turn.pk}),
                           (titles, {"title": None}))
    assert pipelines == ([1] if connection.vendor == "postgresql" else [])
    assert [[fields(o) for o in rows] for rows in got] == [[fields(o) for o in rows] for rows in alone]
    assert got[1][0].pk == step.pk and got[1][0].result == {"output": ["a", {"b": None}]}
    assert "agent" in got[0][0]._state.fields_cache and got[2] == []
    assert all_together() == []
    with transaction.atomic():  # inside a transaction too
        assert all_together((steps, {"turn_id": turn.pk}), (steps, {"turn_id": uuid.uuid4()}))[1] == []
