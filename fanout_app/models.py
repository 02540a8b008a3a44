"""Subagents (a session's child sessions, with their lineage) and batches (sessions started together).

Neither has a status of its own: a child's state is its session's and its turn's; a batch's
progress is counted from its sessions. Lineage rows are written once, when the child is created.
"""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from agentops.models import Team
from sessions_app.models import AgentProfile, AgentSession, Step


class SubagentLink(models.Model):
    """One child session spawned by a parent's ``spawn_subagents`` call."""

    child = models.OneToOneField(AgentSession, on_delete=models.CASCADE, primary_key=True,
                                 related_name="subagent_link")
    parent = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="subagent_children")
    root = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="+")
    parent_step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="subagent_children")
    index = models.PositiveIntegerField()           # the task's position in the call's list
    depth = models.PositiveIntegerField()           # 1 for a root's child
    agent_path = models.CharField(max_length=500)   # "rebooking-desk/0 › seat-check/1": who asked whom
    task = models.JSONField(default=dict)           # the task as the parent gave it (instructions, input, …)
    # The parent's timeline got this child's ``subagent.finished`` card update (once, by a parent tick).
    finish_announced = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["parent_step_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["parent_step", "index"], name="subagent_unique_index"),
            models.CheckConstraint(condition=Q(depth__gte=1), name="subagent_depth_positive"),
        ]

    def __str__(self) -> str:
        return self.agent_path


class Batch(models.Model):
    """Sessions started together from one list of inputs (API or dashboard)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="batches")
    agent = models.ForeignKey(AgentProfile, on_delete=models.PROTECT, related_name="batches")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="batches")
    title = models.CharField(max_length=200, blank=True)
    idempotency_key = models.CharField(max_length=200, blank=True)
    # A replay with the same key but other rows is refused: the hash of what was asked.
    request_sha256 = models.CharField(max_length=64)
    size = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "idempotency_key"], condition=~Q(idempotency_key=""),
                                    name="batch_unique_idempotency_key"),
        ]

    def __str__(self) -> str:
        return self.title or f"batch {str(self.id)[:8]}"


class BatchMember(models.Model):
    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="members")
    session = models.OneToOneField(AgentSession, on_delete=models.CASCADE, related_name="batch_member")
    row = models.PositiveIntegerField()

    class Meta:
        ordering = ["batch_id", "row"]
        constraints = [models.UniqueConstraint(fields=["batch", "row"], name="batchmember_unique_row")]
