"""The customer runners' endpoints (``/api/runner/...``): authenticated by the runner's own token
(``Authorization: Bearer aor_…``: its secret part; the public key after it stays on the runner),
never by a user's. Async views: a long-poll must not hold the one thread daphne runs sync views in;
database work runs in worker threads (``database_read``).
"""

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from django.conf import settings
from django.http import HttpRequest
from ninja import Router, Schema
from ninja.errors import HttpError
from ninja.responses import Status

from agentops.api import ERRORS
from agentops.asyncdb import database_read
from agentops.schemas import Out
from hosts_app import runners
from hosts_app.models import SandboxHost
from hosts_app.runner_files import upload_chunk_bytes
from hosts_app.services import wake_key

router = Router(tags=["runners"])
R = TypeVar("R")


class HeartbeatIn(Schema):
    versions: dict[str, Any] = {}
    self_test: dict[str, Any] = {}


class HeartbeatOut(Out):
    name: str
    team: str
    poll_seconds: float
    upload_chunk_bytes: int  # the most one request may carry of a published file


class ProgressIn(Schema):
    output: str


class ResultIn(Schema):
    result: dict[str, Any]
    files: list[dict[str, Any]] = []


class RecordedOut(Out):
    recorded: bool


class PartOut(Out):
    received: int


class RefusedIn(Schema):
    reason: str
    replayed: bool = False  # the job had already run there: its result stands


class ManifestIn(Schema):
    changed: bool | None


def _token(request: HttpRequest) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _as_runner(token: str, action: Callable[..., R], **kwargs: Any) -> tuple[SandboxHost, R]:
    """Authenticate the runner and act for it in the same database visit (one worker thread hop:
    under load each hop costs milliseconds). Unknown, revoked or outdated token: 401, nothing done."""
    host = runners.runner_authenticate(token)
    if host is None:
        raise HttpError(401, "Unknown or revoked runner token.")
    return host, action(host=host, **kwargs)


async def _act(request: HttpRequest, action: Callable[..., R], **kwargs: Any) -> tuple[SandboxHost, R]:
    return await database_read(_as_runner)(_token(request), action, **kwargs)


def _heartbeat(*, host: SandboxHost, versions: dict[str, Any], self_test: dict[str, Any]) -> str:
    runners.runner_heartbeat(host=host, versions=versions, self_test=self_test)
    return host.team.slug if host.team else ""


@router.post("/heartbeat", auth=None, response={200: HeartbeatOut, **ERRORS})
async def runner_heartbeat_api(request: HttpRequest, payload: HeartbeatIn) -> dict[str, Any]:
    host, team = await _act(request, _heartbeat, versions=payload.versions, self_test=payload.self_test)
    return {"name": host.name, "team": team, "poll_seconds": settings.AGENTOPS_RUNNER_POLL_SECONDS,
            "upload_chunk_bytes": upload_chunk_bytes()}


@router.post("/jobs/next", auth=None, response={200: dict[str, Any], 204: None, **ERRORS})
async def runner_job_next_api(request: HttpRequest, wait: float = 20.0) -> Any:
    """Long-poll: a signed job as soon as one is ready, else 204 after ``wait`` seconds.

    It waits on the runner's wake-up list (``hosts_app.services.runner_wake``): the engine's
    hand-over pushes the step's id, and the poll claims that step at once; a manifest check or a
    revocation pushes a word that makes it look at everything or authenticate again. Without a
    wake-up it looks at everything every second (a lost wake-up only delays). Every look
    authenticates again: a revoked runner gets nothing more, even in the middle of its poll."""
    host, job = await _act(request, runners.runner_next_job)
    if job is not None:
        return job
    deadline = time.monotonic() + max(0.0, min(wait, settings.AGENTOPS_RUNNER_POLL_SECONDS))
    looked = time.monotonic()
    client = aioredis.from_url(settings.REDIS_URL)
    try:
        while (left := deadline - time.monotonic()) > 0:
            message = None
            try:
                popped = await client.blpop([wake_key(host.name)], timeout=max(0.05, min(1.0, left)))
                message = popped[1].decode() if popped else None
            except aioredis.RedisError:
                await asyncio.sleep(min(1.0, left))
            if message is not None and time.monotonic() - looked < 1.0:
                _host, job = await _act(request, runners.runner_woken_job, message=message)
            else:
                _host, job = await _act(request, runners.runner_next_job)
                looked = time.monotonic()
            if job is not None:
                return job
        return Status(204, None)
    finally:
        await client.aclose()


@router.post("/jobs/{job_id}/progress", auth=None, response={204: None, **ERRORS})
async def runner_progress_api(request: HttpRequest, job_id: str, payload: ProgressIn) -> Any:
    await _act(request, runners.runner_progress, job_id=job_id, output=payload.output)
    return Status(204, None)


@router.post("/jobs/{job_id}/files/{sha256}", auth=None, response={200: PartOut, **ERRORS})
async def runner_file_part_api(request: HttpRequest, job_id: str, sha256: str, offset: int, size: int) -> Any:
    """One part of a file the job published: the request's raw body (``application/octet-stream``),
    ``offset`` into the file of ``size`` bytes. Sent before the result that names the file."""
    _host, received = await _act(request, runners.runner_file_part, job_id=job_id, sha256=sha256, offset=offset,
                                 size=size, data=request.body)
    return {"received": received}


@router.post("/jobs/{job_id}/result", auth=None, response={200: RecordedOut, **ERRORS})
async def runner_result_api(request: HttpRequest, job_id: str, payload: ResultIn) -> dict[str, Any]:
    _host, recorded = await _act(request, runners.runner_result_record, job_id=job_id, result=payload.result,
                                 files=payload.files)
    return {"recorded": recorded}


@router.post("/jobs/{job_id}/refused", auth=None, response={204: None, **ERRORS})
async def runner_refused_api(request: HttpRequest, job_id: str, payload: RefusedIn) -> Any:
    await _act(request, runners.runner_refusal_record, job_id=job_id, reason=payload.reason,
               replayed=payload.replayed)
    return Status(204, None)


@router.post("/jobs/{job_id}/manifest", auth=None, response={204: None, **ERRORS})
async def runner_manifest_api(request: HttpRequest, job_id: str, payload: ManifestIn) -> Any:
    await _act(request, runners.runner_manifest_answer, job_id=job_id, changed=payload.changed)
    return Status(204, None)


