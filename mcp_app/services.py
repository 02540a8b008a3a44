"""Writes for mcp_app: the server's admin-visible status, discovery (tools → ToolDefinitions), and
invalidating pending approvals of a tool whose schema changed.

Discovery talks to the server outside any transaction and records in one short transaction.
"""

import hashlib
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from agentops import dispatch
from agentops.domain import DomainError, canonical_json
from approvals_app.models import ApprovalRequest
from approvals_app.services import approval_request_create, approval_transition
from sessions_app.events import event_record
from sessions_app.locks import session_lock
from sessions_app.models import Step
from sessions_app.services import step_transition
from tools_app.builtin import validate_arguments
from tools_app.models import ApprovalMode, NetworkPolicy, ToolDefinition, validate_json_schema
from tools_app.sandbox import sandbox_ids
from tools_app.sandbox.workspace import workspace_root
from tools_app.selectors import tool_definitions_cache_clear

from .models import McpServer, McpTool
from .secret_refs import resolve_references

if TYPE_CHECKING:  # the mcp SDK is imported where a server is called: every process loads this module
    from mcp import types

    from .client import ServerConnection

log = logging.getLogger(__name__)
SEPARATOR = "__"


def mcp_server_status_record(*, server_id: int, status: str, message: str = "") -> None:
    """What the last contact with the server said (admin-visible). Writes only on a change of
    status or message: a healthy server's every call does not rewrite its row."""
    with transaction.atomic():
        server = McpServer.objects.select_for_update().get(pk=server_id)
        if server.status == status and server.status_message == message[:2000]:
            return
        server.ensure_can_move_to(status)
        server.status, server.status_message, server.checked_at = status, message[:2000], timezone.now()
        server.save(update_fields=["status", "status_message", "checked_at", "updated_at"])


def server_connection(server: McpServer, *, workspace: Path) -> "ServerConnection":
    """How to reach ``server`` now. Resolves its ``{{secret:NAME}}`` references: call only in the
    task that connects, and never store what it returns."""
    from .client import ServerConnection

    consumer = f"mcp:{server.name}"
    return ServerConnection(
        name=server.name, transport=server.transport, timeout=server.timeout_seconds, workspace=workspace,
        command=[str(a) for a in server.command or []], mounts=[str(m) for m in server.mounts or []],
        env=resolve_references(dict(server.env or {}), team_id=server.team_id, consumer=consumer),
        network=server.network, url=server.url,
        headers=resolve_references(dict(server.headers or {}), team_id=server.team_id, consumer=consumer))


def tool_definition_name(server_name: str, remote_name: str) -> str:
    """``<server>__<tool>``: what the model calls it (OpenAI function names: [A-Za-z0-9_-]{1,64})."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", remote_name)
    return f"{server_name}{SEPARATOR}{clean}"[:64]


def suggested_mode(tool: "types.Tool") -> str:
    """The server's annotations only suggest: read-only → safe_readonly; anything else mutating."""
    hints = tool.annotations
    return ApprovalMode.SAFE_READONLY if hints is not None and hints.readOnlyHint else ApprovalMode.MUTATING


def _source_version(server: McpServer, remote_name: str, schema_sha: str) -> str:
    """Server identity + tool + schema: a server moved to another URL or command is another source.
    Header and env *values* are left out (they may be secret references; resolved values never are)."""
    doc = {"transport": server.transport, "command": server.command, "url": server.url, "mounts": server.mounts,
           "network": server.network, "headers": sorted(server.headers or {}), "env": sorted(server.env or {}),
           "tool": remote_name, "schema": schema_sha}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()[:32]


@dataclass
class RefreshReport:
    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why each skipped tool was skipped, for the admin
    invalidated: int = 0
    error: str = ""


def discovery_workspace() -> Path:
    """An empty scratch workspace for listing a stdio server's tools (removed afterwards)."""
    path = Path(tempfile.mkdtemp(prefix="mcp-discovery-", dir=workspace_root()))
    uid, gid = sandbox_ids()
    shutil.chown(path, uid, gid)
    return path


def mcp_server_refresh(*, server_id: int) -> RefreshReport:
    """Discover the server's tools and record them: new ones become ToolDefinitions (approval mode
    ``mutating`` until an admin chooses; the suggestion is kept beside), changed ones get the new
    schema and version and their pending approvals are invalidated, vanished ones are disabled."""
    from .client import McpFailure, list_tools

    server = McpServer.objects.get(pk=server_id)
    workspace = discovery_workspace()
    try:
        tools = list_tools(server_connection(server, workspace=workspace))
    except (McpFailure, DomainError) as exc:  # DomainError: a {{secret:NAME}} the vault refuses (was a 500)
        mcp_server_status_record(server_id=server.id, status=McpServer.Status.ERROR, message=exc.message)
        return RefreshReport(error=exc.message)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    with transaction.atomic():
        server = McpServer.objects.select_for_update().get(pk=server.pk)  # two discoveries at once: one by one
        report = _record_tools(server, tools)
        affected = report.changed + report.removed
        report.invalidated = mcp_pending_approvals_invalidate(tool_names=affected) if affected else 0
        mcp_server_status_record(server_id=server.id, status=McpServer.Status.OK,
                                 message="; ".join([f"{len(tools)} tools listed", *report.notes]))
    tool_definitions_cache_clear()
    return report


def _record_tools(server: McpServer, tools: "list[types.Tool]") -> RefreshReport:
    from .client import tool_sha256

    report = RefreshReport()
    known = {t.remote_name: t for t in McpTool.objects.select_related("definition").filter(server=server)}
    network = server.network if server.transport == McpServer.Transport.STDIO else NetworkPolicy.HOST
    seen = set()
    for remote in tools:
        name = tool_definition_name(server.name, remote.name)
        try:
            validate_json_schema(remote.inputSchema)
        except ValidationError as exc:
            log.warning("MCP server %s: tool %s has an unusable schema: %s", server.name, remote.name, exc.messages)
            continue
        seen.add(remote.name)
        sha = tool_sha256(remote)
        fields = {"description": (remote.description or remote.title or remote.name)[:4000],
                  "parameters_schema": remote.inputSchema, "network": network,
                  "timeout_seconds": server.timeout_seconds,
                  "idempotent": bool(remote.annotations and remote.annotations.idempotentHint),
                  "enabled": server.enabled, "source_version": _source_version(server, remote.name, sha)}
        existing = known.get(remote.name)
        holder = _name_holder(name) if existing is None else ""
        if holder:
            note = f"skipped {remote.name[:128]!r}: the name {name} is already held by {holder}"
            log.warning("MCP server %s: %s", server.name, note)
            report.skipped.append(name)
            report.notes.append(note)
            continue
        if existing is None:
            # A definition a deleted server left is taken over as if new: mutating, and offered to
            # no agent (it kept the old server's approval mode and agents, so another server's tool
            # could run unasked in agents that had chosen the old one).
            definition, created = ToolDefinition.objects.update_or_create(
                name=name, defaults={**fields, "kind": ToolDefinition.Kind.MCP, "approval_mode": ApprovalMode.MUTATING})
            if not created:
                definition.agents.clear()
            McpTool.objects.create(server=server, definition=definition, remote_name=remote.name, schema_sha256=sha,
                                   annotations=_annotations(remote), output_schema=remote.outputSchema,
                                   suggested_mode=suggested_mode(remote))
            report.created.append(name)
            continue
        definition = existing.definition
        if existing.schema_sha256 == sha and existing.present and all(
                getattr(definition, k) == v for k, v in fields.items()):
            report.unchanged.append(name)
            continue
        ToolDefinition.objects.filter(pk=definition.pk).update(**fields, updated_at=timezone.now())
        McpTool.objects.filter(pk=existing.pk).update(
            schema_sha256=sha, annotations=_annotations(remote), output_schema=remote.outputSchema,
            suggested_mode=suggested_mode(remote), present=True, updated_at=timezone.now())
        report.changed.append(name)
    for remote_name, gone in known.items():
        if remote_name not in seen and gone.present:
            McpTool.objects.filter(pk=gone.pk).update(present=False, updated_at=timezone.now())
            ToolDefinition.objects.filter(pk=gone.definition_id).update(enabled=False, updated_at=timezone.now())
            report.removed.append(gone.definition.name)
    return report


def _name_holder(name: str) -> str:
    """Who holds the tool name ``name`` ('' when a new tool may take it). Names are global: a
    built-in or client tool's, another server's tool (``a`` listing ``b__c`` and ``a__b`` listing
    ``c`` are both ``a__b__c``), or this server's own for another remote name (two names that
    sanitise or truncate alike). A definition left by a deleted server is free to take, as before."""
    held = ToolDefinition.objects.filter(name=name).first()
    if held is None:
        return ""
    if held.kind != ToolDefinition.Kind.MCP:
        return f"a {held.kind} tool"
    owner = McpTool.objects.select_related("server").filter(definition=held).first()
    if owner is None:
        return ""
    return f"tool {owner.remote_name[:128]!r} of MCP server {owner.server.name!r}"


def mcp_tools_apply_suggested_modes(*, server_id: int) -> int:
    """Set each of the server's tools to the mode its annotations suggest (an admin's explicit
    choice, never automatic). Returns how many changed."""
    changed = 0
    with transaction.atomic():
        for tool in McpTool.objects.select_related("definition").filter(server_id=server_id):
            if tool.definition.approval_mode != tool.suggested_mode:
                ToolDefinition.objects.filter(pk=tool.definition_id).update(approval_mode=tool.suggested_mode,
                                                                            updated_at=timezone.now())
                changed += 1
    tool_definitions_cache_clear()
    return changed


def _annotations(tool: "types.Tool") -> dict[str, object]:
    return tool.annotations.model_dump(exclude_none=True) if tool.annotations else {}


def mcp_pending_approvals_invalidate(*, tool_names: list[str]) -> int:
    """Cancel every pending approval of these tools (what the reviewer would approve is not what
    would run any more) and ask again under the new definition; a call whose arguments the new
    schema refuses, or whose tool is gone, is rejected with the reason (the model is told).
    Call inside atomic(). Returns how many requests were invalidated."""
    count = 0
    pending = ApprovalRequest.objects.filter(tool_name__in=tool_names, kind=ApprovalRequest.Kind.TOOL,
                                             status=ApprovalRequest.Status.PENDING).order_by("created_at")
    for approval in pending:
        session_lock(approval.session_id)
        tool = ToolDefinition.objects.filter(name=approval.tool_name).first()
        step = Step.objects.get(pk=approval.step_id)
        approval_transition(request_id=approval.request_id, to=ApprovalRequest.Status.CANCELLED)
        event_record(session_id=approval.session_id, turn_id=approval.turn_id, step_id=approval.step_id,
                     type="approval.invalidated",
                     payload={"request_id": str(approval.request_id), "team_id": approval.team_id,
                              "tool": approval.tool_name, "changed": ["tool_version"],
                              "message": "The MCP server changed this tool's definition; this request no longer "
                                         "covers what would run and was cancelled."})
        errors = validate_arguments(tool.name, tool.parameters_schema, step.arguments) if tool else ["gone"]
        if tool is None or not tool.enabled or errors:
            why = ("the tool is no longer available" if tool is None or not tool.enabled
                   else "the arguments do not fit its new schema: " + "; ".join(errors[:5]))
            note = (f"The MCP tool {approval.tool_name!r} changed before a reviewer decided; {why}. "
                    "The call did not run.")
            step_transition(step_id=step.id, session_id=step.session_id, to=Step.Status.REJECTED,
                            event_type="tool.failed", event_payload={"result": {"status": "failed", "output": note}},
                            result={"status": "failed", "error_code": "mcp_tool_changed", "output": note},
                            error_code="mcp_tool_changed", error_message=note)
        else:
            approval_request_create(step_id=step.id, risk="high",
                                    risk_note="The MCP server changed this tool; asked again under its new schema.",
                                    network_policy=tool.network, ttl_seconds=tool.approval_ttl_seconds)
        dispatch.tick_enqueue(step.turn_id)
        count += 1
    return count


@transaction.atomic
def mcp_server_delete(*, server_id: int) -> None:
    """Delete a server and disable the tool definitions it provided: they stayed enabled on the
    agents that had them, and a call went to a reviewer before failing ("No MCP server provides ...")."""
    names = list(McpTool.objects.filter(server_id=server_id).values_list("definition__name", flat=True))
    ToolDefinition.objects.filter(name__in=names).update(enabled=False)
    McpServer.objects.filter(pk=server_id).delete()
    transaction.on_commit(tool_definitions_cache_clear)
