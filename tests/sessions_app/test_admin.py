"""The sessions' admin: an edit writes what the form changed, and the title search follows it."""

from typing import Any

from django.contrib import admin
from django.contrib.auth.models import User
from django.test import RequestFactory

from sessions_app.events import event_record
from sessions_app.models import AgentProfile, AgentSession, SessionTitle
from sessions_app.selectors import sessions_list
from tests import factories


def _admin_edit(session_id: Any, editor: User, read: AgentSession, **changes: Any) -> None:
    """What the change view does with a form that was filled from ``read``, then edited."""
    model_admin = admin.site._registry[AgentSession]
    request = RequestFactory().post(f"/admin/sessions_app/agentsession/{session_id}/change/")
    request.user = editor
    form_class = model_admin.get_form(request, read, change=True)
    shown = form_class(instance=read)
    data = {name: value for name in shown.fields if (value := shown[name].value()) is not None}
    form = form_class({**data, **changes}, instance=read)
    assert form.is_valid(), form.errors
    model_admin.save_model(request, form.save(commit=False), form, change=True)


def test_an_admin_edit_writes_what_it_changed_not_the_seq_the_engine_wrote_meanwhile(operator: User,
                                                                                      agent: AgentProfile) -> None:
    session = factories.session(agent=agent, owner=operator, title="Refund for order 1182")
    boss = factories.user("boss", is_staff=True, is_superuser=True)
    read = AgentSession.objects.get(pk=session.pk)  # the change view reads the row for the posted edit
    event_record(session_id=session.pk, type="session.note", payload={})  # the engine writes meanwhile
    event_record(session_id=session.pk, type="session.note", payload={})

    _admin_edit(session.pk, boss, read, title="Refund for order 1183")

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

    _admin_edit(session.pk, boss, AgentSession.objects.get(pk=session.pk), title="")

    assert not SessionTitle.objects.filter(session=session).exists()
    assert not sessions_list(user=operator, q="audit").exists()
    _admin_edit(session.pk, boss, AgentSession.objects.get(pk=session.pk), title="Audit, again")
    assert [s.title for s in sessions_list(user=operator, q="audit")] == ["Audit, again"]
