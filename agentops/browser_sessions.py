"""Browser sessions in the database, as Django's ``db`` engine stores them, read with SQL compiled once.

Every browser request and every WebSocket connect reads its session's row (``SessionMiddleware``,
channels' ``get_user``); building that one query through the ORM each time was ~0.35 ms of the
~8 ms of CPU a WebSocket connect costs a web process (bench/README.md, issue 10).
``agentops.prepared`` compiles it once. An expired row is no session, as Django's store answers.
"""

from django.contrib.sessions.backends import db
from django.contrib.sessions.models import Session
from django.utils import timezone

from agentops.prepared import Prepared

_BY_KEY = Prepared(lambda session_key: Session.objects.filter(session_key=session_key))


class SessionStore(db.SessionStore):
    def _get_session_from_db(self) -> Session | None:
        key = self.session_key
        row = _BY_KEY.first(session_key=key) if key else None
        if row is None or row.expire_date <= timezone.now():
            self._session_key = None
            return None
        return row
