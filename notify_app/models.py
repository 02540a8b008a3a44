"""Outgoing notifications: webhook endpoints per team, the outbox of deliveries and its log,
and the one-time links sent by email."""

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models

from agentops.domain import StateMachine, status_constraint
from agentops.models import Team

NOTIFY_EVENTS = ("approval.requested", "approval.voted", "approval.decided", "approval.escalated",
                 "approval.expired")


class WebhookEndpoint(models.Model):
    """Where a team's approval events are POSTed, signed with ``secret`` (HMAC-SHA256 over
    ``<t>.<body>``; header ``X-Agentops-Signature: t=<unix time>,v1=<hex>``)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=120)
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=200, help_text="Shared with the receiver; never sent.")
    events = models.JSONField(default=list, blank=True, help_text="Event types to send; empty: all.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team", "name"]

    def __str__(self) -> str:
        return f"{self.name} → {self.url}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    DEAD = "dead", "Gave up"


class DeliveryChannel(models.TextChoices):
    WEBHOOK = "webhook", "Webhook"
    EMAIL = "email", "Email"


class Delivery(StateMachine, models.Model):
    """One notification to one endpoint or one mailbox, written in the transaction of the change it
    reports; sent (at least once) by a task, retried with exponential backoff, replayable."""

    Status = DeliveryStatus
    Channel = DeliveryChannel
    TRANSITIONS: ClassVar = {
        Status.PENDING: frozenset({Status.DELIVERED, Status.DEAD}),
        Status.DELIVERED: frozenset({Status.PENDING}),  # a replay from the admin
        Status.DEAD: frozenset({Status.PENDING}),
    }

    delivery_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    channel = models.CharField(max_length=8, choices=Channel.choices)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    endpoint = models.ForeignKey(WebhookEndpoint, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="deliveries")
    recipient = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                                  related_name="+")
    event_type = models.CharField(max_length=40)
    request_id = models.UUIDField(db_index=True)
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "deliveries"
        constraints = [
            status_constraint("delivery", DeliveryStatus),
            status_constraint("delivery", DeliveryChannel, field="channel"),
            models.CheckConstraint(
                condition=(models.Q(channel="webhook", endpoint__isnull=False)
                           | models.Q(channel="email", recipient__isnull=False)),
                name="delivery_has_target"),
        ]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="delivery_due_idx")]

    def __str__(self) -> str:
        return f"{self.channel} {self.event_type} ({self.status})"


class DeliveryAttempt(models.Model):
    """The delivery log: one row per attempt, with what the receiver answered."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="log")
    attempt = models.PositiveIntegerField()
    ok = models.BooleanField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"attempt {self.attempt} of {self.delivery_id}: {self.status_code or self.error[:40]}"


class LinkUse(models.Model):
    """A one-time email link that was opened: its nonce, so a second open is refused."""

    nonce = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    request_id = models.UUIDField()
    used_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.nonce
