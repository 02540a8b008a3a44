"""A customer runner behind a man in the middle (``runner_kit.Interceptor``: a proxy on its path that
reads and answers everything, as a broken TLS path would): what it sees must not let it make the
runner run anything nobody approved, nor run an approved job twice."""

import hashlib
import hmac
import time
import uuid
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentops.runner.protocol import canonical_json, spec_sha256
from hosts_app.models import RunnerResult, SandboxHost
from sessions_app.models import Event, Step
from tests.e2e.conftest import Stack, World
from tests.e2e.runner_kit import Interceptor, RunnerProcs, approved_command, online
from tests.helpers import finished
from tests.waiting import wait_for
from tools_app.binding import run_spec
from tools_app.models import ToolDefinition

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def unapproved_job(runner: str, command: str) -> dict[str, Any]:
    """A run_command job as the server would write it, that nobody requested or approved."""
    spec = run_spec(tool=ToolDefinition.objects.get(name="run_command"), arguments={"command": command})
    now = time.time()
    return {"type": "tool", "job_id": f"{uuid.uuid4()}:1", "step_id": str(uuid.uuid4()),
            "session_id": str(uuid.uuid4()), "tool": "run_command", "arguments": spec["arguments"],
            "timeout_seconds": spec["timeout_seconds"], "network": spec["network"], "idempotent": False,
            "spec": spec, "approval_sha256": spec_sha256(spec), "approval_request_id": None,
            "approved_sha256": None, "runner": runner, "issued_at": now, "expires_at": now + 300}


def test_a_man_in_the_middle_cannot_make_the_runner_run_a_job_of_its_own(
        world: World, stack: Stack, runner_setup: tuple[RunnerProcs, str], interceptor: Interceptor) -> None:
    """The audit's attack: the proxy read the runner's bearer token, derived the job-signing key
    from it (HMAC(token, context), as the runner did) and served a signed ``id > pwned.txt``: the
    runner ran it. Now only the server's secret derives the key: signed with anything the proxy
    can make from the bearer token or from the runner's database row, the job is refused and
    nothing runs."""
    procs, _token = runner_setup
    procs.start(url=interceptor.url)
    wait_for(lambda: online("cust-1") and interceptor.bearer, 60, "the runner online through the proxy")
    row = SandboxHost.objects.filter(name="cust-1").values().get()
    known = [interceptor.bearer, row["token_hash"], str(row.get("public_key", "")), str(row.get("signing_key", ""))]
    served: list[dict[str, Any]] = []
    for material in filter(None, known):
        old_key = hmac.new(material.encode(), b"agentops-runner-job-signing-v1", hashlib.sha256).hexdigest()
        job = unapproved_job("cust-1", "id > pwned.txt")
        served.append({"job": job, "signature": hmac.new(old_key.encode(), canonical_json(job).encode(),
                                                         hashlib.sha256).hexdigest()})
        job = unapproved_job("cust-1", "id > pwned.txt")
        ed25519 = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(material.encode()).digest())
        served.append({"job": job, "signature": ed25519.sign(canonical_json(job).encode()).hex()})
    for envelope in served:
        interceptor.serve(envelope)

    wait_for(lambda: all(interceptor.answers(e["job"]["job_id"]) for e in served), 90,
             "the runner to answer every job the proxy served (refuse it, or run it and post its result)")
    ran = [e["job"]["session_id"] for e in served
           if (procs.workdir / "workspaces" / e["job"]["session_id"] / "pwned.txt").exists()]
    assert ran == [], "the runner ran a job nobody approved"
    reasons = [body["reason"] for body in interceptor.posted("/refused")]
    assert reasons == ["bad signature"] * len(served)
    assert procs.procs[0].poll() is None  # and it goes on serving


def test_a_replayed_job_runs_once_even_after_the_runner_restarts(
        world: World, stack: Stack, runner_setup: tuple[RunnerProcs, str], interceptor: Interceptor) -> None:
    """The audit's replay: the proxy served the runner the last real job envelope again (still
    signed, not expired) and the approved ``date >> count.txt`` ran twice. The runner records each
    job before running it, in its work directory: served again, by the same process or after a
    restart, it is refused and reported; the step keeps its one run."""
    procs, _token = runner_setup
    procs.start(url=interceptor.url)
    wait_for(lambda: online("cust-1"), 60, "the runner online through the proxy")
    session, turn = approved_command(world, "date >> count.txt")
    turn = finished(turn, timeout=60)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    (envelope,) = [e for e in interceptor.jobs if e["job"]["type"] == "tool"]
    job_id = envelope["job"]["job_id"]
    count = procs.workdir / "workspaces" / str(session.id) / "count.txt"
    assert len(count.read_text().splitlines()) == 1

    interceptor.serve(envelope)  # the same signed job, again, well within its validity
    wait_for(lambda: interceptor.answers(job_id) == 2 or None, 60, "the runner to answer the replay")
    assert len(count.read_text().splitlines()) == 1, "the replayed job ran again"
    procs.kill_all()
    procs.start(url=interceptor.url)  # a new process, the same work directory
    interceptor.serve(envelope)
    wait_for(lambda: interceptor.answers(job_id) == 3 or None, 60, "the restarted runner to answer the replay")
    assert len(count.read_text().splitlines()) == 1, "the replayed job ran again after a restart"
    assert [body["replayed"] for body in interceptor.posted(f"/jobs/{job_id}/refused")] == [True, True]
    step = Step.objects.get(turn=turn, kind="tool")
    assert step.status == "completed" and RunnerResult.objects.filter(step=step).count() == 1
    wait_for(lambda: Event.objects.filter(step=step, type="runner.job_refused", payload__replayed=True).count() == 2
             or None, 30, "both refusals in the timeline")  # the proxy saw the second one before the server
    assert Step.objects.get(pk=step.pk).status == "completed"
