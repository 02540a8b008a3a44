"""An MCP tool result as a ``ToolResult``: text joined into the output, structured content kept
(and shown to the model as JSON when there is no text) unless it is over ``STRUCTURED_CAP_BYTES``
or only repeats the content, images written under the workspace's ``outputs/mcp/`` and published
as artifacts, embedded resources summarised."""

import base64
import binascii
import json
import mimetypes
import os
import re
import uuid
from pathlib import Path
from typing import Any

from mcp import types

from tools_app.builtin import ToolResult, cap_text
from tools_app.builtin.registry import OUTPUT_CAP_CHARS
from tools_app.sandbox import PathDenied, open_beneath, sandbox_ids
from tools_app.sandbox.workspace import resolve_in_workspace

MAX_IMAGE_BYTES = 10 * 1024 * 1024
IMAGE_DIR = "outputs/mcp"
# Structured content is stored in the step's result and served with every read of the turn, like
# the text (capped at OUTPUT_CAP_CHARS): over this, as JSON, it is dropped with a note.
STRUCTURED_CAP_BYTES = OUTPUT_CAP_CHARS
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


def image_name(server: str, tool: str, step_id: str, index: int, ext: str) -> str:
    """A file name for the server's image: the remote tool name is the server's to choose (``/``,
    ``..``), so only ``[A-Za-z0-9_-]`` of it is kept: the file lands in ``outputs/mcp`` and nowhere else."""
    stem = "-".join(_UNSAFE_NAME.sub("_", part)[:64] for part in (server, tool, step_id[:8], str(index)))
    return stem + ext


def _write_image(workspace: Path, name: str, data: bytes) -> str:
    """Write ``data`` as a new file ``outputs/mcp/<name>`` in the workspace; returns its relative path.

    The worker runs as root and the workspace is the sandbox's, where a server (kept running beside
    the call) may plant a symlink at ``outputs`` or ``outputs/mcp``: followed, the write and the
    chown would land on any host directory. So a path that goes through a symlink is refused
    (PathDenied), and the write walks directory fds with ``O_NOFOLLOW`` (``open_beneath``: a
    symlink swapped in after the check fails the open), creating the file with ``O_EXCL``. Only
    what was created here is given to the sandbox uid (a later command may need the file).
    """
    rel = f"{IMAGE_DIR}/{name}"
    if resolve_in_workspace(workspace, rel) != rel:
        raise PathDenied(f"{IMAGE_DIR} goes through a symlink")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = open_beneath(workspace, rel, flags, 0o644, create_parents=True)
    except FileExistsError:  # a retried step wrote its image already: a new name, never an overwrite
        stem, ext = os.path.splitext(name)
        rel = f"{IMAGE_DIR}/{stem}-{uuid.uuid4().hex[:8]}{ext}"
        fd = open_beneath(workspace, rel, flags, 0o644, create_parents=True)
    try:
        os.fchown(fd, *sandbox_ids())
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return rel


def tool_result_from_mcp(result: types.CallToolResult, *, server: str, tool: str, workspace: Path,
                         step_id: str) -> ToolResult:
    texts: list[str] = []
    published: list[dict[str, Any]] = []
    for index, item in enumerate(result.content):
        if isinstance(item, types.TextContent):
            texts.append(item.text)
        elif isinstance(item, types.ImageContent):
            try:
                raw = base64.b64decode(item.data, validate=True)
            except (binascii.Error, ValueError):
                texts.append(f"[image {index}: not valid base64; dropped]")
                continue
            if len(raw) > MAX_IMAGE_BYTES:
                texts.append(f"[image {index}: {len(raw)} bytes, over the {MAX_IMAGE_BYTES}-byte cap; dropped]")
                continue
            ext = mimetypes.guess_extension(item.mimeType or "") or ".bin"
            try:
                rel = _write_image(workspace, image_name(server, tool, step_id, index, ext), raw)
            except (PathDenied, OSError) as exc:  # ENOTDIR, ELOOP: a symlink swapped in meanwhile
                texts.append(f"[image {index}: not written to the workspace (refused: {exc}); dropped]")
                continue
            published.append({"path": rel})
            texts.append(f"[image {index}: {item.mimeType}, {len(raw)} bytes, published as {rel}]")
        elif isinstance(item, types.EmbeddedResource):
            resource = item.resource
            body = resource.text if isinstance(resource, types.TextResourceContents) else "(binary)"
            texts.append(f"[resource {resource.uri}]\n{body}")
        elif isinstance(item, types.ResourceLink):
            texts.append(f"[resource link {item.uri}]")
        else:
            texts.append(f"[{getattr(item, 'type', 'unknown')} content]")
    structured = result.structuredContent
    output = "\n".join(texts)
    data: dict[str, Any] = {"mcp_server": server, "mcp_tool": tool}
    if structured is not None:
        encoded = json.dumps(structured, ensure_ascii=False)
        output = output or encoded  # capped below, as any text
        omitted = _structured_omitted(structured, encoded, result.content)
        if omitted:
            data["structured_omitted"] = omitted
        else:
            data["structured"] = structured
    if result.isError:
        return ToolResult(status="failed", output=cap_text(output or "The tool reported an error."),
                          error_code="mcp_tool_error", error_message=cap_text(output, 2000),
                          published_files=published, data=data)
    return ToolResult(status="completed", output=cap_text(output), published_files=published, data=data)



def _structured_omitted(structured: dict[str, Any], encoded: str, content: list[Any]) -> str:
    """Why the structured content is not kept ('' to keep it). FastMCP repeats every str (or
    content-list) return as ``{"result": ...}``: a 5 MiB text was stored twice, the copy uncapped."""
    if list(structured) == ["result"]:
        value = structured["result"]
        texts = [item.text for item in content if isinstance(item, types.TextContent)]
        if isinstance(value, str) and texts == [value]:
            return "the same as the text; dropped"
        if isinstance(value, list) and len(value) == len(content) and all(
                isinstance(v, dict) and v.get("type") == item.type for v, item in zip(value, content, strict=True)):
            return "the same as the content; dropped"
    size = len(encoded.encode())
    if size > STRUCTURED_CAP_BYTES:
        return f"{size} bytes of JSON, over the {STRUCTURED_CAP_BYTES}-byte cap; dropped"
    return ""
