"""Helpers shared by the tests: clients (the API with a Bearer token, a logged-in browser, a
WebSocket), scripts for the scripted model, waiting on the engine, the database URL for worker
subprocesses, finding sandboxed processes, and the suite's two sizes (``FULL``)."""

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psutil
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.test import Client
from django.utils import timezone

from agentops.models import ApiToken
from agentops.services import api_token_create
from approvals_app.models import ApprovalRequest
from sessions_app.models import Event, Turn
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
# The long proofs run in full under `make test FULL=1` (AGENTOPS_TEST_FULL=1); `make test` (CI) runs a
# short form of each: the same real processes and assertions on less data or time, so it still fails.
FULL = os.environ.get("AGENTOPS_TEST_FULL", "") not in ("", "0")
_Size = TypeVar("_Size", int, float)


def full_or_short(full: _Size, short: _Size) -> _Size:
    """``full`` under ``make test FULL=1``, else ``short``."""
    return full if FULL else short


# worker_process(kind="worker" | "gateway", failpoint=..., beat=..., marker=...) -> the process
WorkerFactory = Callable[..., subprocess.Popen[bytes]]


def api_token(user: User) -> str:
    """A new API token of ``user``."""
    return api_token_create(username=user.username)[1]


def api_client(user: User, **client_kwargs: Any) -> Client:
    """A test client that authenticates every request with a Bearer token of ``user``, a token in
    use (its last_used_at is fresh, so no request of the test writes it)."""
    client = Client(headers={"Authorization": f"Bearer {api_token(user)}"}, **client_kwargs)
    ApiToken.objects.filter(user=user).update(last_used_at=timezone.now())
    return client


def login(user: User) -> Client:
    """A test client logged in as ``user`` (a browser session)."""
    client = Client()
    client.force_login(user)
    return client


@database_sync_to_async
def cookie_for(user: User) -> bytes:
    """The Cookie header of a logged-in browser of ``user``."""
    return f"sessionid={login(user).cookies['sessionid'].value}".encode()


async def ws_communicator(path: str, user: User | None) -> WebsocketCommunicator:
    """A WebSocket client of the ASGI application, from our origin, logged in as ``user`` (or anonymous)."""
    from agentops.asgi import application

    headers = [(b"origin", b"http://testserver")]
    if user is not None:
        headers.append((b"cookie", await cookie_for(user)))
    return WebsocketCommunicator(application, path, headers=headers)


def layer_receive(layer: Any, channel: str) -> dict[str, Any]:
    """``layer.receive(channel)`` from sync code, on an event loop of its own that lives until the
    layer has removed the backup copies of what it took (``agentops.channel_layer``: a task of that
    loop). ``async_to_sync(layer.receive)`` cancelled that task as its loop closed, and the next
    receive got the same message again."""
    import asyncio

    from asgiref.sync import async_to_sync

    async def receive() -> dict[str, Any]:
        message: dict[str, Any] = await layer.receive(channel)
        await asyncio.gather(*getattr(layer, "receive_cleaners", []))
        return message

    return async_to_sync(receive)()


def script(*lines: str) -> str:
    """A script for the scripted model: one response per line (see scripted_model's docstring)."""
    return "\n".join(lines)


def tool(name: str, **arguments: Any) -> str:
    """A script line asking for one tool call."""
    return f"tool {name} {json.dumps(arguments)}"


def finished(turn: Turn, timeout: float = 30) -> Turn:
    """Wait until the turn is over; return it as stored."""
    def done() -> Turn | None:
        row = Turn.objects.get(pk=turn.pk)
        return row if not row.is_active else None

    result: Turn = wait_for(done, timeout, f"turn {turn.pk} to finish")
    return result


def pending_approvals(turn: Turn, n: int = 1, *, kind: str = "tool", timeout: float = 30) -> list[ApprovalRequest]:
    """Wait until the turn has ``n`` pending requests of ``kind``; return them in step order."""
    def enough() -> list[ApprovalRequest] | None:
        rows = list(ApprovalRequest.objects.filter(turn=turn, kind=kind, status="pending").order_by("step__index"))
        return rows if len(rows) >= n else None

    result: list[ApprovalRequest] = wait_for(enough, timeout, f"{n} pending {kind} requests")
    return result


def assert_gap_free(session_id: Any) -> None:
    """The session's events have seqs 1..n, none missing, none twice."""
    seqs = list(Event.objects.filter(session_id=session_id).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def database_url() -> str:
    """The test database as a DATABASE_URL, for the worker and web processes a test starts."""
    s = connection.settings_dict
    if connection.vendor != "postgresql":
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def redis_url_of_worker(url: str, worker: str) -> str:
    """``url`` with the Redis database of pytest-xdist worker ``worker`` ("gw<N>"): its number plus N."""
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0) + int(worker.removeprefix("gw"))
    if db > 15:
        raise RuntimeError(f"xdist worker {worker} would need Redis database {db} of {url}: at most 16 (0..15)")
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def sandboxed(marker: str) -> list[psutil.Process]:
    """The live processes whose command line carries ``marker`` (bubblewrap itself excluded)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if marker in cmdline and "bwrap" not in cmdline and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


@contextmanager
def statements_sent() -> Iterator[list[str]]:
    """Every SQL statement and commit this thread sends meanwhile, from any of its connections, in
    order (commits as ``"COMMIT"``). Django's ``CaptureQueriesContext`` sees only the connection
    of the current context: not what a gateway driven by ``asyncio.run`` on this thread sends
    from its event loop's own connection. Other threads (an in-process Celery worker) are left out."""
    sent: list[str] = []
    mine = threading.get_ident()
    execute, executemany, commit = CursorWrapper.execute, CursorWrapper.executemany, BaseDatabaseWrapper.commit

    def counting_execute(self: CursorWrapper, sql: str, params: Any = None) -> Any:
        if threading.get_ident() == mine:
            sent.append(sql)
        return execute(self, sql, params)

    def counting_executemany(self: CursorWrapper, sql: str, param_list: Any) -> Any:
        if threading.get_ident() == mine:
            sent.append(sql)
        return executemany(self, sql, param_list)

    def counting_commit(self: BaseDatabaseWrapper) -> None:
        if threading.get_ident() == mine:
            sent.append("COMMIT")
        commit(self)

    setattr(CursorWrapper, "execute", counting_execute)  # noqa: B010  (mypy: a method is not assignable)
    setattr(CursorWrapper, "executemany", counting_executemany)  # noqa: B010
    setattr(BaseDatabaseWrapper, "commit", counting_commit)  # noqa: B010
    try:
        yield sent
    finally:
        setattr(CursorWrapper, "execute", execute)  # noqa: B010
        setattr(CursorWrapper, "executemany", executemany)  # noqa: B010
        setattr(BaseDatabaseWrapper, "commit", commit)  # noqa: B010


def admin_edit(read: Any, editor: User, **changes: Any) -> None:
    """What the admin's change view does with ``read`` (the row as it read it when the edit was
    posted) and a form filled from it, then edited with ``changes``: the form checked, then saved."""
    from django.contrib import admin
    from django.test import RequestFactory

    model_admin = admin.site._registry[type(read)]
    request = RequestFactory().post(f"/admin/{read._meta.app_label}/{read._meta.model_name}/{read.pk}/change/")
    request.user = editor
    form_class = model_admin.get_form(request, read, change=True)
    shown = form_class(instance=read)
    data = {name: value for name in shown.fields if (value := shown[name].value()) is not None}
    form = form_class({**data, **changes}, instance=read)
    assert form.is_valid(), form.errors
    model_admin.save_model(request, form.save(commit=False), form, change=True)


# The hard limit of open files the open-files tests give their child processes: Linux's own default
# (and below systemd's), so a test runs the same on any host rather than on the one's it inherits.
CHILD_OPEN_FILES_HARD = 4096


def open_files_limited(soft: int, hard: int = CHILD_OPEN_FILES_HARD) -> Callable[[], None]:
    """A child's ``preexec_fn``: start it with ``soft`` open files and a hard limit of ``hard``."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
