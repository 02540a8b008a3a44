"""The files a runner's job published: uploaded in parts, put together when the result names them;
one that did not arrive whole is said in the step's result, where the reviewer reads it."""

import hashlib
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from hosts_app import runners
from hosts_app.models import SessionPlacement
from hosts_app.runner_files import upload_chunk_bytes
from sessions_app.models import Artifact, Step
from tests import factories

pytestmark = pytest.mark.django_db


def running_step(runner: Any, operator: User) -> Step:
    session = factories.session(owner=operator)
    SessionPlacement.objects.create(session=session, host=runner)
    return factories.step(factories.turn(session), tool_name="run_command", status="running",
                          lease_owner=f"runner:{runner.name}", arguments={"command": "make"})


def test_runner_result_record_puts_parts_together_and_says_which_files_did_not_arrive(settings: Any) -> None:
    settings.AGENTOPS_MAX_REQUEST_BYTES = 5000
    operator = factories.user("op", groups=["operators"])
    runner, _token = runners.runner_create(team=factories.team(), name="cust", actor=operator)
    step = running_step(runner, operator)
    job_id = f"{step.id}:1"
    data = bytes(range(256)) * 100  # 25,600 bytes: six parts of at most upload_chunk_bytes()
    digest = hashlib.sha256(data).hexdigest()
    chunk = upload_chunk_bytes()
    for offset in range(0, len(data), chunk):
        part = data[offset:offset + chunk]
        received = runners.runner_file_part(host=runner, job_id=job_id, sha256=digest, offset=offset,
                                            size=len(data), data=part)
        assert received == offset + len(part)
    half = b"half of it"
    runners.runner_file_part(host=runner, job_id=job_id, sha256=hashlib.sha256(half * 2).hexdigest(), offset=0,
                             size=len(half) * 2, data=half)  # its second part never comes
    files = [{"path": "outputs/whole.bin", "size": len(data), "sha256": digest},
             {"path": "outputs/half.txt", "size": len(half) * 2, "sha256": hashlib.sha256(half * 2).hexdigest()},
             {"path": "outputs/huge.iso", "size": 600_000_000, "sha256": "0" * 64,
              "not_uploaded": "the server refused it (422: the artifact limit)"}]
    assert runners.runner_result_record(host=runner, job_id=job_id, files=files,
                                        result={"status": "completed", "output": "built"})
    step.refresh_from_db()
    assert step.status == "completed"
    (artifact,) = Artifact.objects.filter(step=step)
    assert (artifact.path, artifact.size, artifact.sha256) == ("outputs/whole.bin", len(data), digest)
    assert (Path(settings.AGENTOPS_ARTIFACT_ROOT) / artifact.storage_path).read_bytes() == data
    output = (step.result or {})["output"]
    assert output.startswith("built\n")
    assert "outputs/half.txt (20 bytes) was not uploaded: 10 of its 20 bytes arrived." in output
    assert "outputs/huge.iso (600000000 bytes) was not uploaded: the server refused it (422" in output
    assert [m["path"] for m in (step.result or {})["files_not_uploaded"]] == ["outputs/half.txt", "outputs/huge.iso"]
    parts = Path(settings.AGENTOPS_ARTIFACT_ROOT) / str(step.session_id) / "parts"
    assert not [p for p in parts.rglob("*") if p.is_file()]


def test_a_file_over_the_artifact_limit_is_refused_for_good() -> None:
    from agentops.domain import InvalidArguments
    from tools_app.builtin.files import PUBLISH_MAX_BYTES

    operator = factories.user("op", groups=["operators"])
    runner, _token = runners.runner_create(team=factories.team(), name="cust", actor=operator)
    step = running_step(runner, operator)
    with pytest.raises(InvalidArguments, match="artifact limit"):
        runners.runner_file_part(host=runner, job_id=f"{step.id}:1", sha256="0" * 64, offset=0,
                                 size=PUBLISH_MAX_BYTES + 1, data=b"x")
