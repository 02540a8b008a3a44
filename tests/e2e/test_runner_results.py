"""A customer runner's results against a server whose request limit is small (60 KB here, 1 MB by
default): a published file many times the limit arrives whole, in parts; a result the server
refuses for good is reported as such and the runner goes on polling. Before, both wedged the
runner: it re-sent the refused body (413) every second for ever, the step running for ever."""

import hashlib
from pathlib import Path

import pytest
from django.conf import settings

from sessions_app.engine.commands import turn_submit
from sessions_app.models import AgentSession, Artifact, Step
from tests.e2e.conftest import Stack, World
from tests.e2e.runner_kit import RunnerProcs, approve, approved_command, online
from tests.helpers import finished, pending_approvals, script, tool
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
LIMIT = 60_000


@pytest.fixture(scope="module")
def stack_env() -> dict[str, str]:
    return {"AGENTOPS_MAX_REQUEST_BYTES": str(LIMIT)}


def next_command_runs(world: World, session: AgentSession) -> None:
    """The runner still polls: the session's next approved command runs and its turn completes."""
    turn = turn_submit(session_id=session.id, input=script(tool("run_command", command="echo after"), "ok"))
    (approval,) = pending_approvals(turn, timeout=60)
    approve(world.reviewer, approval)
    turn = finished(turn, timeout=60)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    assert "after" in (Step.objects.get(turn=turn, kind="tool").result or {})["output"]


def test_a_published_file_far_over_the_request_limit_arrives_whole(
        world: World, stack: Stack, runner_setup: tuple[RunnerProcs, str]) -> None:
    procs, _token = runner_setup
    procs.start()
    wait_for(lambda: online("cust-1"), 60, "the runner online")
    session, turn = approved_command(world, "mkdir -p outputs && head -c 3000000 /dev/urandom > outputs/big.bin")
    turn = finished(turn, timeout=120)
    assert turn.status == "completed", (turn.error_code, turn.error_message)
    made = (procs.workdir / "workspaces" / str(session.id) / "outputs" / "big.bin").read_bytes()
    (artifact,) = Artifact.objects.filter(session=session)
    stored = (Path(settings.AGENTOPS_ARTIFACT_ROOT) / artifact.storage_path).read_bytes()
    assert (artifact.path, artifact.size, artifact.sha256) == ("outputs/big.bin", 3_000_000,
                                                              hashlib.sha256(made).hexdigest())
    assert stored == made
    parts = Path(settings.AGENTOPS_ARTIFACT_ROOT) / str(session.id) / "parts"
    assert not [p for p in parts.rglob("*") if p.is_file()]  # put together, then dropped
    assert not any((procs.workdir / "pending-results").iterdir())
    next_command_runs(world, session)


def test_a_result_refused_for_good_is_reported_and_the_runner_goes_on(
        world: World, stack: Stack, runner_setup: tuple[RunnerProcs, str]) -> None:
    procs, _token = runner_setup
    procs.start()
    wait_for(lambda: online("cust-1"), 60, "the runner online")
    # ~64 KB of output (the sandbox's cap): the result's body is over the server's 60 KB.
    session, turn = approved_command(world, "head -c 200000 /dev/zero | tr '\\0' x")
    step = wait_for(lambda: Step.objects.filter(turn=turn, kind="tool", status="failed").first(), 120,
                    "the step failed with the refusal")
    assert step.error_code == "result_refused"
    assert "server refused its result (413" in (step.result or {})["output"]
    wait_for(lambda: not any((procs.workdir / "pending-results").iterdir()) or None, 30,
             "the runner to drop the result once the failure is acknowledged")
    finished(turn, timeout=60)
    next_command_runs(world, session)
