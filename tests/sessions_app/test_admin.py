"""The sessions' admin: an edit writes what the form changed, and the title search follows it."""

from django.contrib.auth.models import User

from sessions_app.events import event_record
from sessions_app.models import AgentProfile, AgentSession, SessionTitle
from sessions_app.selectors import sessions_list
from tests import factories
from tests.helpers import admin_edit


def test_an_admin_edit_writes_what_it_changed_not_the_seq_the_engine_wrote_meanwhile(operator: User,
                                                                                      agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator, title="Refund for order 1182")
    boss = factories.user("boss", is_staff=True, is_superuser=True)
    read = AgentSession.objects.get(pk=session.pk)  # the change view reads the row for the posted edit
    event_record(session_id=session.pk, type="session.note", payload={})  # the engine writes meanwhile
    event_record(session_id=session.pk, type="session.note", payload={})

    admin_edit(read, boss, title="Refund for order 1183")

    session.refresh_from_db()
    assert session.title == "Refund for order 1183"
    assert session.last_seq == read.last_seq + 2  # a whole-row save put back the seq it had read
    event_record(session_id=session.pk, type="session.note", payload={})  # and the next event has a seq of its own
    assert [s.id for s in sessions_list(user=operator, q="order 1183")] == [session.pk]
    assert not sessions_list(user=operator, q="order 1182").exists()


def test_an_admin_edit_that_clears_the_title_removes_it_from_the_search(operator: User,
                                                                        agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator, title="Quarterly audit")
    assert SessionTitle.objects.filter(session=session).exists()
    boss = factories.user("boss", is_staff=True, is_superuser=True)

    admin_edit(AgentSession.objects.get(pk=session.pk), boss, title="")

    assert not SessionTitle.objects.filter(session=session).exists()
    assert not sessions_list(user=operator, q="audit").exists()
    admin_edit(AgentSession.objects.get(pk=session.pk), boss, title="Audit, again")
    assert [s.title for s in sessions_list(user=operator, q="audit")] == ["Audit, again"]
