"""Browser sessions (``agentops.browser_sessions``): Django's database sessions, read with SQL
compiled once, answering what Django's own store answers."""

from datetime import timedelta

import pytest
from django.contrib.sessions.backends.db import SessionStore as DjangoStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from agentops.browser_sessions import SessionStore

pytestmark = pytest.mark.django_db


def test_a_stored_session_is_read_back_and_an_expired_or_unknown_one_is_empty() -> None:
    stored = SessionStore()
    stored["_auth_user_id"] = "7"
    stored.save()
    for _ in range(2):  # the second time through the compiled SQL
        again = SessionStore(session_key=stored.session_key)
        assert again["_auth_user_id"] == "7" and again.session_key == stored.session_key
        assert dict(DjangoStore(session_key=stored.session_key).items()) == dict(again.items())
    Session.objects.filter(session_key=stored.session_key).update(expire_date=timezone.now() - timedelta(seconds=1))
    expired = SessionStore(session_key=stored.session_key)
    assert dict(expired.items()) == {} and expired.session_key is None
    assert dict(DjangoStore(session_key=stored.session_key).items()) == {}
    unknown = SessionStore(session_key="x" * 32)
    assert dict(unknown.items()) == {} and unknown.session_key is None


def test_the_settings_use_it() -> None:
    from django.conf import settings

    assert settings.SESSION_ENGINE == "agentops.browser_sessions"
