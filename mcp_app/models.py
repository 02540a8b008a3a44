"""MCP servers as team-scoped tool sources, and the tools discovered on them.

Each discovered tool is also a ``tools_app.ToolDefinition`` (kind ``mcp``, named
``<server>__<tool>``): agents select it like a built-in and the engine gates, approves, claims and
records it on the same path; ``mcp_app.runner`` is what calls the server.
"""

import re
from typing import ClassVar

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from agentops.domain import StateMachine, status_constraint
from agentops.models import Team
from tools_app.models import ApprovalMode, NetworkPolicy, ToolDefinition

SERVER_NAME_RE = r"^[a-z][a-z0-9_]{0,23}$"


class McpTransport(models.TextChoices):
    STDIO = "stdio", "stdio (a command, run inside the sandbox)"
    HTTP = "http", "Streamable HTTP (a URL)"


class McpServerStatus(models.TextChoices):
    UNKNOWN = "unknown", "Not checked yet"
    OK = "ok", "OK"
    ERROR = "error", "Error (down, slow or malformed)"
    CHANGED = "changed", "Tool list changed since the last discovery"


class McpServer(StateMachine, models.Model):
    """An MCP server an admin registered for one team. ``headers`` and ``env`` values may name
    secrets as ``{{secret:NAME}}``: they are resolved only in the executing task
    (``mcp_app.secret_refs``)."""

    Transport = McpTransport
    Status = McpServerStatus
    S = Status
    # The health of a server is whatever its last contact said: every move is allowed.
    TRANSITIONS: ClassVar = {s: frozenset(McpServerStatus.values) - {s} for s in McpServerStatus.values}

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="mcp_servers")
    name = models.CharField(max_length=24, unique=True, validators=[RegexValidator(SERVER_NAME_RE)],
                            help_text="Lower-case, digits and _; tools are named <name>__<tool>.")
    transport = models.CharField(max_length=8, choices=Transport.choices, default=Transport.STDIO)
    command = models.JSONField(default=list, blank=True,
                               help_text='stdio: the argv run in the sandbox, e.g. ["python3", "/path/server.py"].')
    mounts = models.JSONField(default=list, blank=True,
                              help_text="stdio: host directories the server needs, bound read-only at the same path.")
    url = models.URLField(blank=True, help_text="http: the streamable HTTP endpoint, e.g. http://host:8000/mcp")
    headers = models.JSONField(default=dict, blank=True, help_text="http: request headers ({{secret:NAME}} allowed).")
    env = models.JSONField(default=dict, blank=True, help_text="stdio: environment ({{secret:NAME}} allowed).")
    network = models.CharField(max_length=8, choices=NetworkPolicy.choices, default=NetworkPolicy.NONE,
                               help_text="stdio: the sandbox's network while the server runs.")
    timeout_seconds = models.PositiveIntegerField(default=30, help_text="Deadline of one call, start to result.")
    enabled = models.BooleanField(default=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.UNKNOWN)
    status_message = models.TextField(blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"
        constraints = [
            status_constraint("mcpserver", McpServerStatus),
            models.CheckConstraint(condition=Q(transport__in=McpTransport.values), name="mcpserver_transport_valid"),
            models.CheckConstraint(condition=Q(network__in=NetworkPolicy.values), name="mcpserver_network_valid"),
            models.CheckConstraint(condition=Q(timeout_seconds__gte=1), name="mcpserver_timeout_positive"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """What a server needs to be reached, checked when it is saved (the admin's form calls this):
        each of these saved fine and failed at discovery, a 500 for some (a string command ran
        character by character; headers that were a list)."""
        errors: dict[str, str] = {}
        if self.transport == McpTransport.STDIO:
            if not isinstance(self.command, list) or not self.command or not all(
                    isinstance(a, str) and a for a in self.command):
                errors["command"] = 'A non-empty JSON list of strings, e.g. ["python3", "/srv/server.py"].'
            if not isinstance(self.mounts, list) or not all(
                    isinstance(m, str) and m.startswith("/") and m not in FORBIDDEN_MOUNTS for m in self.mounts):
                errors["mounts"] = (f"A JSON list of absolute host paths (not {', '.join(sorted(FORBIDDEN_MOUNTS))}).")
        elif not self.url:
            errors["url"] = "An http server needs its URL."
        if not isinstance(self.env, dict) or not all(
                isinstance(k, str) and ENV_NAME_RE.match(k) and isinstance(v, str) for k, v in self.env.items()):
            errors["env"] = 'A JSON object of NAME → text, e.g. {"TOKEN": "{{secret:tracker_token}}"}.'
        if not isinstance(self.headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and not set(k + v) & {"\r", "\n"}
                for k, v in self.headers.items()):
            errors["headers"] = "A JSON object of header → text (no line breaks)."
        if errors:
            raise ValidationError(errors)


ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Host paths a server may not see (even read-only): credentials and the machine's configuration.
FORBIDDEN_MOUNTS = frozenset({"/", "/etc", "/root", "/home", "/proc", "/sys", "/dev", "/var", "/boot"})


class McpTool(models.Model):
    """One tool of a server as last discovered. ``schema_sha256`` is the hash of what the server
    declared (name, input schema, annotations): a call checks it against the live list first."""

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools")
    definition = models.OneToOneField(ToolDefinition, on_delete=models.CASCADE, related_name="mcp_tool")
    remote_name = models.CharField(max_length=128)
    schema_sha256 = models.CharField(max_length=64)
    annotations = models.JSONField(default=dict, blank=True)
    output_schema = models.JSONField(null=True, blank=True)
    suggested_mode = models.CharField(max_length=16, choices=ApprovalMode.choices, default=ApprovalMode.MUTATING,
                                      help_text="What the server's annotations suggest; the admin decides.")
    present = models.BooleanField(default=True, help_text="False: the server no longer lists it (disabled).")
    discovered_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["server", "remote_name"]
        verbose_name = "MCP tool"
        constraints = [
            models.UniqueConstraint(fields=["server", "remote_name"], name="mcptool_unique_per_server"),
            models.CheckConstraint(condition=Q(suggested_mode__in=ApprovalMode.values),
                                   name="mcptool_suggested_mode_valid"),
        ]

    def __str__(self) -> str:
        return self.definition.name
