"""Secrets: a value encrypted at rest (Fernet), a team, the tools allowed to use it, an expiry.

The value is never read back by anyone: the API and the admin only write it; the executing task
decrypts it (``vault_app.resolve``) to put it where a ``{{secret:NAME}}`` reference asks for it.
A value that was replaced or deleted is kept (encrypted) as a ``RetiredSecretValue`` for
AGENTOPS_SECRET_RETIRED_REDACT_DAYS, only so that the redactor keeps hiding it.
"""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from tools_app.secret_refs import SECRET_NAME


class Secret(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey("agentops.Team", on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=100, help_text="Referenced as {{secret:NAME}}: lower case, digits, _ . -")
    description = models.CharField(max_length=500, blank=True)
    ciphertext = models.TextField(help_text="Fernet token of the value (AGENTOPS_SECRET_KEYS).")
    allowed_tools = models.JSONField(
        default=list, blank=True,
        help_text="Tool names (or glob patterns, e.g. tracker__*) that may use this secret; empty = none.")
    expires_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    value_updated_at = models.DateTimeField(auto_now_add=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="secret_unique_name_per_team"),
            models.CheckConstraint(condition=Q(name__regex=rf"^{SECRET_NAME}$"), name="secret_name_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.team_id})"


class RetiredSecretValue(models.Model):
    """A value a secret no longer has (replaced or deleted), still redacted: a file a command wrote
    while it was live, or an API that echoes it, can hand it back later, and a rotated credential
    is often still valid. Never resolved for a call; dropped after the retention period."""

    id = models.BigAutoField(primary_key=True)
    team = models.ForeignKey("agentops.Team", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100, help_text="The secret's name: redacted as [secret:NAME].")
    ciphertext = models.TextField(help_text="Fernet token of the retired value (AGENTOPS_SECRET_KEYS).")
    retired_at = models.DateTimeField()

    class Meta:
        ordering = ["team_id", "-retired_at"]
        indexes = [models.Index(fields=["team", "retired_at"], name="retired_secret_team_time")]

    def __str__(self) -> str:
        return f"{self.name} (retired {self.retired_at:%Y-%m-%d}, {self.team_id})"
