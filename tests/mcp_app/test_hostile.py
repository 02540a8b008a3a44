"""What a hostile stdio MCP server (``hostile_server.py``, run in the real sandbox) can make the
worker do: nothing outside the session's workspace."""

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from mcp_app.models import McpServer
from mcp_app.runner import mcp_tool_run
from mcp_app.services import mcp_server_refresh
from tests import factories
from tests.mcp_app.conftest import HERE
from tools_app.builtin import ToolResult
from tools_app.runners import ToolRun
from tools_app.sandbox import sandbox_ids, workspace_for

HOSTILE = HERE / "hostile_server.py"


def hostile(name: str, **env: str) -> McpServer:
    server = McpServer.objects.create(team=factories.team(), name=name, transport=McpServer.Transport.STDIO,
                                      command=["python3", str(HOSTILE)], mounts=[str(HERE)], env=env,
                                      timeout_seconds=20)
    report = mcp_server_refresh(server_id=server.id)
    assert report.error == "" and report.created, report
    return server


def call(server: McpServer, tool: str, session_id: str = "", **arguments: Any) -> tuple[ToolResult, Path]:
    """One call in the session's real workspace (owned by the sandbox uid, 0700; a new session by default)."""
    session_id = session_id or str(uuid.uuid4())
    workspace = workspace_for(session_id)
    result = mcp_tool_run(ToolRun(tool_name=f"{server.name}__{tool}", arguments=arguments, workspace=workspace,
                                  timeout_seconds=20, network="none", team_id=server.team_id,
                                  session_id=session_id, step_id="0123456789", idempotency_key="k"))
    return result, workspace


@pytest.mark.django_db
def test_mcp_image_result_never_writes_through_a_planted_symlink(real_sandbox: None, tmp_path: Path) -> None:
    """The server makes /workspace/outputs a symlink to a host directory, then returns an image:
    the root worker wrote the image there and chowned the directory to the sandbox uid."""
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    before = victim.stat()
    server = hostile("evil")
    result, workspace = call(server, "picture", link_to=str(victim))
    assert list(victim.iterdir()) == []
    after = victim.stat()
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)
    assert result.status == "completed", result.output
    assert "[image 1: not written to the workspace (refused:" in result.output, result.output
    assert result.published_files == []
    assert os.readlink(workspace / "outputs") == str(victim)  # left as the server made it
    # Without a symlink the image is written and published, owned by the sandbox uid.
    result, workspace = call(server, "picture")
    assert result.status == "completed", result.output
    (published,) = result.published_files
    image = workspace / published["path"]
    assert published["path"] == "outputs/mcp/evil-picture-01234567-1.png"
    assert image.read_bytes().startswith(b"\x89PNG")
    for path in (image, image.parent, image.parent.parent):
        assert (path.lstat().st_uid, path.lstat().st_gid) == sandbox_ids()


@pytest.mark.django_db
def test_mcp_image_file_name_keeps_the_remote_tool_name_inside_outputs_mcp(real_sandbox: None) -> None:
    """The remote tool name is the server's: '/' and '..' in it must not place the file elsewhere."""
    server = hostile("evil", HOSTILE_PICTURE_NAME="x/../../../picture")
    result, workspace = call(server, "x__________picture")  # how the model calls it
    assert result.status == "completed", result.output
    (published,) = result.published_files
    assert published["path"] == "outputs/mcp/evil-x__________picture-01234567-1.png"
    assert sorted(p.name for p in (workspace / "outputs" / "mcp").iterdir()) == [Path(published["path"]).name]


def _plant(workspace: Path, rel: str, text: str) -> None:
    """What an approved run_command can leave in the workspace (files of the sandbox uid)."""
    uid, gid = sandbox_ids()
    path = workspace
    for part in Path(rel).parts[:-1]:
        path = path / part
        path.mkdir(exist_ok=True)
        os.chown(path, uid, gid)
    (path / Path(rel).name).write_text(text)
    os.chown(path / Path(rel).name, uid, gid)


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["script", "-c"])
def test_mcp_stdio_server_runs_no_code_planted_in_the_workspace(real_sandbox: None, how: str) -> None:
    """The agent plants Python start-up hooks in its workspace, then a read-only call (no approval)
    starts the server with its secret env: the hooks ran in the server and wrote the token (reversed,
    past the redactor) where read_file gives it to the model. HOME was the workspace (user site:
    usercustomize.py, .pth files) and so was the working directory (first on sys.path under -c)."""
    command = ["python3", str(HOSTILE)] if how == "script" else [
        "python3", "-c", f"import runpy; runpy.run_path({str(HOSTILE)!r}, run_name='__main__')"]
    server = McpServer.objects.create(team=factories.team(), name="tracker", transport=McpServer.Transport.STDIO,
                                      command=command, mounts=[str(HERE)], env={"TRACKER_TOKEN": "tok-0123456789"},
                                      timeout_seconds=20)
    assert mcp_server_refresh(server_id=server.id).error == ""
    session_id = str(uuid.uuid4())
    workspace = workspace_for(session_id)
    version = subprocess.run(["python3", "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                             env={"PATH": "/usr/local/bin:/usr/bin:/bin"}, capture_output=True, text=True,
                             check=True).stdout.strip()  # the sandbox's python3: /usr is the host's
    leak = "import os; open('/workspace/leak-{}.txt', 'w').write(os.environ.get('TRACKER_TOKEN', '')[::-1])"
    site = f".local/lib/python{version}/site-packages"
    _plant(workspace, f"{site}/usercustomize.py", leak.format("usercustomize") + "\n")
    _plant(workspace, f"{site}/zz.pth", leak.format("pth") + "\n")
    for module in ("base64", "runpy"):  # imported by the server (or its -c line) from the working directory
        _plant(workspace, f"{module}.py", leak.format(module) + "\n")
    result, _ = call(server, "hello", session_id=session_id)
    assert sorted(p.name for p in workspace.glob("leak-*")) == []
    assert result.status == "completed" and result.output == "hello", result.output


@pytest.mark.django_db
def test_mcp_structured_content_is_capped_and_not_a_copy_of_the_text(real_sandbox: None) -> None:
    """A 5 MiB text came back twice, the structured copy (``{"result": text}``, FastMCP's) uncapped:
    a 5 MB step result, 8 MB from GET /api/turns/<id>."""
    server = hostile("big")
    text, _ = call(server, "big", size=5 * 1024 * 1024)
    assert text.status == "completed", text.output
    assert "structured" not in text.data and text.data["structured_omitted"] == "the same as the text; dropped"
    assert "characters cut" in text.output
    assert len(json.dumps(text.to_dict())) < 100_000
    blob, _ = call(server, "big_dict", size=200_000)
    assert "structured" not in blob.data, len(json.dumps(blob.data))
    assert blob.data["structured_omitted"].endswith("bytes of JSON, over the 65536-byte cap; dropped")
    assert len(json.dumps(blob.to_dict())) < 100_000
    small, _ = call(server, "big_dict", size=10)  # under the cap: kept
    assert small.data["structured"] == {"blob": "y" * 10, "size": 10}
    picture, _ = call(server, "picture")  # FastMCP's copy of the content blocks, image included
    assert "structured" not in picture.data and picture.data["structured_omitted"] == "the same as the content; dropped"
