"""The customer runners' endpoints (``/api/runner/...``): authenticated by the runner's own token
(``Authorization: Bearer aor_…``), never by a user's. Async views: a long-poll must not hold the
one thread daphne runs sync views in; database work runs in worker threads (``database_read``).
"""

import contextlib
import time
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from django.http import HttpRequest
from ninja import Router, Schema
from ninja.errors import HttpError
from ninja.responses import Status

from agentops.api import ERRORS
from agentops.asyncdb import database_read
from hosts_app import runners
from hosts_app.models import SandboxHost

router = Router(tags=["runners"])


class HeartbeatIn(Schema):
    versions: dict[str, Any] = {}
    self_test: dict[str, Any] = {}


class HeartbeatOut(Schema):
    name: str
    team: str
    poll_seconds: float


class ProgressIn(Schema):
    output: str


class ResultIn(Schema):
    result: dict[str, Any]
    files: list[dict[str, Any]] = []


class RecordedOut(Schema):
    recorded: bool


class RefusedIn(Schema):
    reason: str


class ManifestIn(Schema):
    changed: bool | None


async def _runner(request: HttpRequest) -> SandboxHost:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    host = await database_read(runners.runner_authenticate)(token.strip()) if scheme.lower() == "bearer" else None
    if host is None:
        raise HttpError(401, "Unknown or revoked runner token.")
    return host


@router.post("/heartbeat", auth=None, response={200: HeartbeatOut, **ERRORS})
async def runner_heartbeat_api(request: HttpRequest, payload: HeartbeatIn) -> dict[str, Any]:
    host = await _runner(request)
    host = await database_read(runners.runner_heartbeat)(host=host, versions=payload.versions,
                                                         self_test=payload.self_test)
    team = await database_read(lambda: host.team.slug if host.team else "")()
    return {"name": host.name, "team": team, "poll_seconds": settings.AGENTOPS_RUNNER_POLL_SECONDS}


@router.post("/jobs/next", auth=None, response={200: dict[str, Any], 204: None, **ERRORS})
async def runner_job_next_api(request: HttpRequest, wait: float = 20.0) -> Any:
    """Long-poll: a signed job as soon as one is ready, else 204 after ``wait`` seconds."""
    host = await _runner(request)
    deadline = time.monotonic() + max(0.0, min(wait, settings.AGENTOPS_RUNNER_POLL_SECONDS))
    client = aioredis.from_url(settings.REDIS_URL)
    try:
        while True:
            job = await database_read(runners.runner_next_job)(host=host)
            if job is not None:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                return Status(204, None)
            # Woken by the engine's hand-over (hosts_app.hooks), or every second for what it missed.
            with contextlib.suppress(aioredis.RedisError):
                await client.blpop([runners.wake_key(host.name)], timeout=max(0.05, min(1.0, left)))
            # A revoked runner gets nothing more, even in the middle of its poll.
            if await database_read(runners.runner_authenticate)(
                    request.headers.get("Authorization", "").partition(" ")[2].strip()) is None:
                raise HttpError(401, "Unknown or revoked runner token.")
    finally:
        await client.aclose()


@router.post("/jobs/{job_id}/progress", auth=None, response={204: None, **ERRORS})
async def runner_progress_api(request: HttpRequest, job_id: str, payload: ProgressIn) -> Any:
    host = await _runner(request)
    await database_read(runners.runner_progress)(host=host, job_id=job_id, output=payload.output)
    return Status(204, None)


@router.post("/jobs/{job_id}/result", auth=None, response={200: RecordedOut, **ERRORS})
async def runner_result_api(request: HttpRequest, job_id: str, payload: ResultIn) -> dict[str, Any]:
    host = await _runner(request)
    recorded = await database_read(runners.runner_result_record)(host=host, job_id=job_id, result=payload.result,
                                                                 files=payload.files)
    return {"recorded": recorded}


@router.post("/jobs/{job_id}/refused", auth=None, response={204: None, **ERRORS})
async def runner_refused_api(request: HttpRequest, job_id: str, payload: RefusedIn) -> Any:
    host = await _runner(request)
    await database_read(runners.runner_refusal_record)(host=host, job_id=job_id, reason=payload.reason)
    return Status(204, None)


@router.post("/jobs/{job_id}/manifest", auth=None, response={204: None, **ERRORS})
async def runner_manifest_api(request: HttpRequest, job_id: str, payload: ManifestIn) -> Any:
    host = await _runner(request)
    await database_read(runners.runner_manifest_answer)(host=host, job_id=job_id, changed=payload.changed)
    return Status(204, None)


