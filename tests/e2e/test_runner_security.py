"""A customer runner behind a man in the middle (``runner_kit.Interceptor``: a proxy on its path that
reads and answers everything, as a broken TLS path would): what it sees must not let it make the
runner run anything nobody approved."""

import hashlib
import hmac
import time
import uuid
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentops.runner.protocol import canonical_json, spec_sha256
from hosts_app.models import SandboxHost
from tests.e2e.conftest import Stack, World
from tests.e2e.runner_kit import Interceptor, RunnerProcs, online
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

    def answered() -> bool:
        """The runner answered every served job (refused it, or ran it and posted its result)."""
        said = {path.split("/")[-2] for path, _ in list(interceptor.seen) if path.endswith(("/refused", "/result"))}
        return all(e["job"]["job_id"] in said for e in served)

    wait_for(answered, 90, "the runner to answer every job the proxy served")
    ran = [e["job"]["session_id"] for e in served
           if (procs.workdir / "workspaces" / e["job"]["session_id"] / "pwned.txt").exists()]
    assert ran == [], "the runner ran a job nobody approved"
    reasons = [body["reason"] for body in interceptor.posted("/refused")]
    assert reasons == ["bad signature"] * len(served)
    assert procs.procs[0].poll() is None  # and it goes on serving
