"""The tool registry as admins configure it, and the email outbox.

``tools_app`` imports no other app: a tool takes a workspace path and arguments and
returns a result.
"""

import re
from typing import Any, ClassVar

import jsonschema
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from agentops.domain import StateMachine, status_constraint


class ApprovalMode(models.TextChoices):
    SAFE_READONLY = "safe_readonly", "Safe (read-only): runs without asking"
    CONFIRM_ONCE = "confirm_once", "Confirm once: a reviewer may allow it for the session"
    MUTATING = "mutating", "Mutating: every call asks a reviewer"


class NetworkPolicy(models.TextChoices):
    NONE = "none", "No network (loopback only)"
    HOST = "host", "Host network"


# Module-level (each model names it as ``Kind`` / ``Status``) so that the models' Meta can build
# their CheckConstraints from the values: a nested class is out of Meta's scope.
class ToolKind(models.TextChoices):
    BUILTIN = "builtin", "Built-in (runs in the sandbox)"
    CLIENT = "client", "Client (the integration submits the output)"
    MCP = "mcp", "MCP server (a registered tool runner calls it; see tools_app.runners)"


class OutboxStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"


def validate_json_schema(value: Any) -> None:
    """Reject anything that is not a valid JSON Schema object describing an object."""
    if not isinstance(value, dict):
        raise ValidationError("The arguments schema must be a JSON object.")
    try:
        jsonschema.Draft202012Validator.check_schema(value)
    except jsonschema.SchemaError as exc:
        raise ValidationError(f"Invalid JSON schema: {exc.message}") from exc
    if value.get("type", "object") != "object":
        raise ValidationError('Tool arguments must be an object: the schema needs "type": "object".')


def validate_command_env(value: Any) -> None:
    """``{"NAME": "value"}`` with shell variable names and string values."""
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValidationError('The environment must be a JSON object of strings: {"NAME": "value"}.')
    bad = [name for name in value if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$", name)]
    if bad:
        raise ValidationError(f"Not an environment variable name: {bad[0][:40]!r}")


class ToolDefinition(models.Model):
    Kind = ToolKind

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.BUILTIN)
    parameters_schema = models.JSONField(default=dict, validators=[validate_json_schema],
                                         help_text="JSON Schema of the arguments (type: object).")
    approval_mode = models.CharField(max_length=16, choices=ApprovalMode.choices,
                                     default=ApprovalMode.MUTATING)
    network = models.CharField(max_length=8, choices=NetworkPolicy.choices, default=NetworkPolicy.NONE)
    timeout_seconds = models.PositiveIntegerField(default=60)
    max_attempts = models.PositiveIntegerField(default=3)
    idempotent = models.BooleanField(default=False)
    env = models.JSONField(
        default=dict, blank=True, validators=[validate_command_env],
        help_text='Environment of the tool\'s sandboxed commands, {"NAME": "value"}; a value may reference a '
                  'secret of the session\'s team: {"API_TOKEN": "{{secret:api_token}}"} (resolved at run time).')
    approval_ttl_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(365 * 86400)],
        help_text="How long a request may wait (1 s to 365 days); empty = the site default.")
    enabled = models.BooleanField(default=True)
    # Where a tool from outside agentops comes from, as a hash (an MCP server's identity, the
    # tool's remote name and schema): part of the tool's version, so of every approval's hash.
    source_version = models.CharField(max_length=64, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(approval_mode__in=ApprovalMode.values),
                                   name="tooldefinition_approval_mode_valid"),
            models.CheckConstraint(condition=Q(kind__in=ToolKind.values),
                                   name="tooldefinition_kind_valid"),
            models.CheckConstraint(condition=Q(network__in=NetworkPolicy.values),
                                   name="tooldefinition_network_valid"),
            models.CheckConstraint(condition=Q(timeout_seconds__gte=1), name="tooldefinition_timeout_positive"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="tooldefinition_attempts_positive"),
        ]

    def __str__(self) -> str:
        return self.name


class Outbox(StateMachine, models.Model):
    """Every email the agents send. The unique idempotency key makes a second send impossible."""

    Status = OutboxStatus
    S = Status
    TRANSITIONS: ClassVar = {
        S.PENDING: frozenset({S.SENT}),
        S.SENT: frozenset(),
    }

    idempotency_key = models.CharField(max_length=200, unique=True)
    to = models.CharField(max_length=500)
    subject = models.CharField(max_length=500)
    body = models.TextField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "outbox"
        constraints = [
            status_constraint("outbox", OutboxStatus),
        ]

    def __str__(self) -> str:
        return f"{self.to}: {self.subject}"
