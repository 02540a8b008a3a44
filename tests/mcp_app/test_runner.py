"""The MCP runner and recovery rules without workers (real servers where one is needed)."""

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from approvals_app.models import ApprovalRequest
from mcp_app import secret_refs
from mcp_app.models import McpServer, McpTool
from mcp_app.runner import mcp_tool_run
from mcp_app.services import _source_version, mcp_server_refresh
from mcp_app.stdio import SERVER_HOME
from sessions_app.engine.recovery import step_recover
from sessions_app.models import AgentSession, Step
from tests import factories
from tests.mcp_app.conftest import FixtureDirs
from tools_app.models import ToolDefinition
from tools_app.runners import ToolRun


def _run(name: str, workspace: Path, team_id: int | None, **arguments: str) -> object:
    return mcp_tool_run(ToolRun(tool_name=name, arguments=arguments, workspace=workspace, timeout_seconds=5,
                                network="host", team_id=team_id, session_id="s", step_id="0123456789",
                                idempotency_key="k"))


@pytest.mark.django_db
def test_mcp_tool_run_refuses_another_team_and_a_changed_tool(http_server: McpServer, tmp_path: Path,
                                                               fixture_dirs: FixtureDirs) -> None:
    assert mcp_server_refresh(server_id=http_server.id).error == ""
    other = factories.team("other")
    denied = _run("fxh__note", tmp_path, other.id, text="x")
    assert denied.status == "failed" and denied.error_code == "denied"  # type: ignore[attr-defined]
    # The server declares the tool otherwise than at discovery: refused before it runs.
    McpTool.objects.filter(definition__name="fxh__note").update(schema_sha256="0" * 64)
    changed = _run("fxh__note", tmp_path, http_server.team_id, text="x")
    assert changed.error_code == "mcp_tool_changed"  # type: ignore[attr-defined]
    http_server.refresh_from_db()
    assert http_server.status == McpServer.Status.CHANGED
    assert not (fixture_dirs.notes / "notes.log").exists()
    ok = _run("fxh__lookup", tmp_path, http_server.team_id, key="k")
    assert ok.status == "completed" and ok.data["structured"] == {"key": "k", "value": "K"}  # type: ignore[attr-defined]
    http_server.refresh_from_db()
    assert http_server.status == McpServer.Status.OK


@pytest.mark.django_db
def test_mcp_secret_reference_without_a_vault_is_a_clear_refusal(http_server: McpServer, tmp_path: Path) -> None:
    assert mcp_server_refresh(server_id=http_server.id).error == ""
    McpServer.objects.filter(pk=http_server.pk).update(headers={"Authorization": "Bearer {{secret:TRACKER}}"})
    refused = _run("fxh__lookup", tmp_path, http_server.team_id, key="k")
    assert refused.error_code == "secret_unavailable" and "{{" not in refused.output  # type: ignore[attr-defined]
    seen: list[str] = []
    def resolver(text: str, **kw: object) -> str:
        seen.append(str(kw["consumer"]))
        return text.replace("{{secret:TRACKER}}", "s3cret")

    vault = secret_refs._resolver  # the vault's (vault_app plugs it in): put back afterwards
    secret_refs.secret_resolver_set(resolver)
    try:
        assert _run("fxh__lookup", tmp_path, http_server.team_id, key="k").status == "completed"  # type: ignore[attr-defined]
    finally:
        secret_refs.secret_resolver_set(vault)
    assert seen == ["mcp:fxh"]


@pytest.mark.django_db
def test_mcp_source_version_binds_the_server_identity() -> None:
    server = McpServer(team=factories.team(), name="a", transport="http", url="http://a/mcp")
    moved = McpServer(team=factories.team(), name="a", transport="http", url="http://b/mcp")
    assert _source_version(server, "t", "x") != _source_version(moved, "t", "x")
    assert _source_version(server, "t", "x") != _source_version(server, "t", "y")


@pytest.mark.django_db
@pytest.mark.parametrize(("idempotent", "outcome"), [(False, "in_doubt"), (True, "approved")])
def test_mcp_step_after_a_worker_crash_is_in_doubt_unless_idempotent(idempotent: bool, outcome: str,
                                                                     tmp_path: Path) -> None:
    ToolDefinition.objects.create(name="srv__act", kind=ToolDefinition.Kind.MCP, network="none",
                                  idempotent=idempotent, parameters_schema={"type": "object"})
    turn = factories.turn()
    step = factories.step(turn, tool_name="srv__act", status=Step.Status.RUNNING, attempts=1,
                          lease_owner="w", lease_expires_at=timezone.now() - timedelta(seconds=5))
    # An unchanged workspace and no network would let a command be retried; an MCP tool's effect is
    # on its server, so only its idempotent annotation allows a retry.
    AgentSession.objects.filter(pk=turn.session_id).update(workspace=str(tmp_path))
    assert step_recover(step.id)
    assert Step.objects.get(pk=step.pk).status == outcome
    recovery_asked = ApprovalRequest.objects.filter(step=step, kind=ApprovalRequest.Kind.RECOVERY).exists()
    assert recovery_asked is (outcome == "in_doubt")


@pytest.mark.django_db
def test_mcp_stdio_server_runs_sandboxed_in_the_workspace_with_its_env(stdio_server: McpServer,
                                                                        tmp_path: Path) -> None:
    """The server runs as the sandbox uid with the session's workspace at /workspace; a secret
    reference in its env is resolved in the task and reaches it through a pipe, not argv."""
    assert mcp_server_refresh(server_id=stdio_server.id).error == ""
    McpServer.objects.filter(pk=stdio_server.pk).update(
        env={**stdio_server.env, "FIXTURE_TOKEN": "{{secret:T}}"})
    workspace = Path(stdio_server.mounts[1]).parent.parent / "ws"  # under the traversable workspace root
    workspace.mkdir(mode=0o777)
    workspace.chmod(0o777)
    vault = secret_refs._resolver  # the vault's: put back afterwards
    secret_refs.secret_resolver_set(lambda text, **kw: text.replace("{{secret:T}}", "it's $HOME \"quoted\""))
    try:
        result = _run("fx__whoami", workspace, stdio_server.team_id)
    finally:
        secret_refs.secret_resolver_set(vault)
    assert result.status == "completed", result.output  # type: ignore[attr-defined]
    seen = result.data["structured"]  # type: ignore[attr-defined]
    assert seen["token"] == "it's $HOME \"quoted\"" and seen["uid"] != 0
    # HOME and the working directory are the server's own, never the agent's workspace.
    assert seen["cwd"] == seen["home"] == SERVER_HOME


@pytest.mark.django_db
def test_mcp_server_headers_resolve_vault_secrets_allowed_for_the_server(http_server: McpServer,
                                                                         tmp_path: Path) -> None:
    """The vault is the resolver: a secret allowed for ``mcp:<server>`` resolves; one that is not
    allowed, or unknown, is a clear refusal and nothing is called."""
    from vault_app.crypto import encrypt
    from vault_app.models import Secret
    from vault_app.resolve import text_resolve

    secret_refs.secret_resolver_set(text_resolve)  # what vault_app's ready() installs (a test may have reset it)
    assert mcp_server_refresh(server_id=http_server.id).error == ""
    Secret.objects.create(team_id=http_server.team_id, name="tracker_token", ciphertext=encrypt("tracker-0123456789"),
                          allowed_tools=["mcp:fxh"])
    Secret.objects.create(team_id=http_server.team_id, name="other_token", ciphertext=encrypt("other-0123456789"),
                          allowed_tools=["http_request"])
    McpServer.objects.filter(pk=http_server.pk).update(headers={"Authorization": "Bearer {{secret:tracker_token}}"})
    ran = _run("fxh__lookup", tmp_path, http_server.team_id, key="k")
    assert ran.status == "completed", (ran.error_code, ran.output)  # type: ignore[attr-defined]
    McpServer.objects.filter(pk=http_server.pk).update(headers={"Authorization": "Bearer {{secret:other_token}}"})
    refused = _run("fxh__lookup", tmp_path, http_server.team_id, key="k")
    assert refused.error_code == "secret_unavailable"  # type: ignore[attr-defined]
    assert "not allowed to use the secret 'other_token'" in refused.output  # type: ignore[attr-defined]
