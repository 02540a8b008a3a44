"""An MCP tool result as a ``ToolResult``: text joined into the output, structured content kept
(and shown to the model as JSON when there is no text), images written under the workspace's
``outputs/mcp/`` and published as artifacts, embedded resources summarised."""

import base64
import binascii
import json
import mimetypes
import os
from pathlib import Path
from typing import Any

from mcp import types

from tools_app.builtin import ToolResult, cap_text
from tools_app.sandbox import sandbox_ids

MAX_IMAGE_BYTES = 10 * 1024 * 1024
IMAGE_DIR = "outputs/mcp"


def _write_image(workspace: Path, name: str, data: bytes) -> str:
    folder = workspace / IMAGE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    target.write_bytes(data)
    if os.geteuid() == 0:  # the sandbox uid owns the workspace; a later command may need the file
        uid, gid = sandbox_ids()
        for path in (workspace / "outputs", folder, target):
            os.chown(path, uid, gid)
    return f"{IMAGE_DIR}/{name}"


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
            rel = _write_image(workspace, f"{server}-{tool}-{step_id[:8]}-{index}{ext}", raw)
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
    if not output and structured is not None:
        output = json.dumps(structured, ensure_ascii=False)
    data: dict[str, Any] = {"mcp_server": server, "mcp_tool": tool}
    if structured is not None:
        data["structured"] = structured
    if result.isError:
        return ToolResult(status="failed", output=cap_text(output or "The tool reported an error."),
                          error_code="mcp_tool_error", error_message=cap_text(output, 2000),
                          published_files=published, data=data)
    return ToolResult(status="completed", output=cap_text(output), published_files=published, data=data)
