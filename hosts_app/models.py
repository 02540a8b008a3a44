"""Sandbox hosts: the machines that hold workspaces and run every workspace operation.

A *hosted* host is a Celery worker of the operator consuming ``sandbox.<name>``; a *runner* is a
customer's process that connects out over HTTPS with a team-scoped token and long-polls for signed
jobs. A session is pinned to one host (``SessionPlacement``) when it is created; only that host
opens its workspace.
"""

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models
from django.db.models import Q

from agentops.domain import StateMachine, status_constraint
from agentops.models import Team


class HostKind(models.TextChoices):
    HOSTED = "hosted", "hosted"
    RUNNER = "runner", "runner"


class HostStatus(models.TextChoices):
    ONLINE = "online", "online"
    OFFLINE = "offline", "offline"  # no heartbeat within AGENTOPS_HOST_OFFLINE_SECONDS
    REVOKED = "revoked", "revoked"  # a runner whose token was revoked: refused at once, for good


class SandboxHost(StateMachine, models.Model):
    Kind = HostKind
    Status = HostStatus
    TRANSITIONS: ClassVar = {
        Status.ONLINE: frozenset({Status.OFFLINE, Status.REVOKED}),
        Status.OFFLINE: frozenset({Status.ONLINE, Status.REVOKED}),
        Status.REVOKED: frozenset(),
    }

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.SlugField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.HOSTED)
    pool = models.SlugField(max_length=64, default="default")
    labels = models.JSONField(default=list, blank=True)
    capacity = models.PositiveIntegerField(default=8, help_text="Sessions working at once it should hold.")
    versions = models.JSONField(default=dict, blank=True)
    self_test = models.JSONField(default=dict, blank=True, help_text="The sandbox self-test it reported.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OFFLINE)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Runners only: the team whose sessions it serves, the SHA-256 of its token's secret (the token
    # is shown once), and the public half of the Ed25519 key its jobs are signed with (the private
    # half is derived from the server's secret when signing: hosts_app/runner_keys.py). Empty: a
    # runner from before signed jobs, refused until it gets a new token.
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.PROTECT, related_name="runners")
    token_hash = models.CharField(max_length=64, blank=True, db_index=True)
    public_key = models.CharField(max_length=64, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pool", "name"]
        constraints = [
            status_constraint("sandboxhost", HostStatus),
            models.CheckConstraint(condition=Q(kind__in=list(HostKind.values)), name="sandboxhost_kind_valid"),
            models.CheckConstraint(condition=Q(kind="hosted") | (Q(team__isnull=False) & ~Q(token_hash="")),
                                   name="sandboxhost_runner_has_team_and_token"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        return f"sandbox.{self.name}"


class AgentHostPolicy(models.Model):
    """Where an agent's sessions run: a pool, and labels a host must carry (all of them)."""

    agent = models.OneToOneField("sessions_app.AgentProfile", on_delete=models.CASCADE, related_name="host_policy")
    pool = models.SlugField(max_length=64, default="default")
    labels = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"{self.agent_id} → {self.pool}"


class SessionPlacement(models.Model):
    """The host a session is pinned to. Changed only by ``session_move`` (with an event)."""

    session = models.OneToOneField("sessions_app.AgentSession", on_delete=models.CASCADE, related_name="placement")
    host = models.ForeignKey(SandboxHost, on_delete=models.PROTECT, related_name="placements")
    pinned_at = models.DateTimeField(auto_now_add=True)
    moved_at = models.DateTimeField(null=True, blank=True)
    moved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="+")

    def __str__(self) -> str:
        return f"{self.session_id} @ {self.host_id}"


class RunnerResult(models.Model):
    """A result a runner uploaded, once per job: a re-sent upload finds this row and changes nothing."""

    job_id = models.CharField(max_length=80, unique=True)
    host = models.ForeignKey(SandboxHost, on_delete=models.CASCADE, related_name="results")
    step = models.ForeignKey("sessions_app.Step", on_delete=models.CASCADE, related_name="+")
    result = models.JSONField(default=dict)
    received_at = models.DateTimeField(auto_now_add=True)
    deliveries = models.PositiveIntegerField(default=1)
