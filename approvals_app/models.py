"""Approval requests (decided by request ID only) and session grants for confirm_once tools."""

import uuid
from typing import ClassVar

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from agentops.domain import StateMachine, status_constraint
from agentops.models import Team
from sessions_app.models import AgentProfile, AgentSession, Step, Turn
from tools_app.models import ApprovalMode

# A request's time to live: from a second to a year (2**40 s overflowed the expiry's date on
# SQLite: every call needing review failed, its session left running with no error).
MAX_TTL_SECONDS = 365 * 86400
TTL_VALIDATORS = [MinValueValidator(1), MaxValueValidator(MAX_TTL_SECONDS)]

class ApprovalKind(models.TextChoices):
    TOOL = "tool", "Tool call"
    RECOVERY = "recovery", "Recovery (outcome unknown after a crash)"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"
    CONSUMED = "consumed", "Consumed"


class ApprovalRequest(StateMachine, models.Model):
    Kind = ApprovalKind

    Status = ApprovalStatus

    class Decision(models.TextChoices):
        APPROVE = "approve", "Approve"
        REJECT = "reject", "Reject"
        RETRY = "retry", "Retry"
        MARK_DONE = "mark_done", "Mark done"
        FAIL = "fail", "Fail"

    TRANSITIONS: ClassVar = {
        Status.PENDING: frozenset({Status.APPROVED, Status.REJECTED, Status.EXPIRED, Status.CANCELLED}),
        Status.APPROVED: frozenset({Status.CONSUMED, Status.CANCELLED}),
        Status.REJECTED: frozenset(),
        Status.EXPIRED: frozenset(),
        Status.CANCELLED: frozenset(),
        Status.CONSUMED: frozenset(),
    }

    request_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.TOOL)
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="approval_requests")
    # The session's team, copied: the queue filters on it without a join, events carry it.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="+")
    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, related_name="approval_requests")
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="approval_requests")
    tool_name = models.CharField(max_length=64)
    arguments = models.JSONField(default=dict)
    # SHA-256 of run_spec (tools_app/binding.py): tool + version, arguments, network, limits, timeout,
    # backend: what the reviewer sees. approved_sha256: the same with the edited arguments, set by the
    # decision; the executing task compares it with the spec of what it is about to run.
    arguments_sha256 = models.CharField(max_length=64)
    run_spec = models.JSONField(default=dict, blank=True)
    approved_sha256 = models.CharField(max_length=64, blank=True)
    approval_mode = models.CharField(max_length=16, choices=ApprovalMode.choices)
    risk = models.CharField(max_length=8, default="high", choices=[("low", "Low"), ("medium", "Medium"),
                                                                  ("high", "High")])
    risk_note = models.TextField(blank=True)
    sandbox_backend = models.CharField(max_length=40, blank=True)
    network_policy = models.CharField(max_length=8, blank=True)
    preview = models.TextField(blank=True, help_text="What the call would change (e.g. a diff), for the reviewer.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    decision = models.CharField(max_length=16, choices=Decision.choices, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="approval_decisions")
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    edited_arguments = models.JSONField(null=True, blank=True)
    # Both versions are kept (arguments as the model asked, edited_arguments as approved) and who edited.
    edited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                  related_name="+")
    seen_sha256 = models.CharField(max_length=64, blank=True)
    remember = models.BooleanField(default=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    # The policy that applied (a snapshot: editing the policy later changes no open request).
    policy = models.ForeignKey("ApprovalPolicy", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    policy_reason = models.TextField(blank=True)
    required_approvals = models.PositiveSmallIntegerField(default=1)
    reviewer_group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    escalation_group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    escalate_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    priority = models.SmallIntegerField(default=0)
    omit_arguments = models.BooleanField(default=False, help_text="Notifications leave the arguments out.")
    # An advisory claim: others see who is on it; it lapses at claimed_until.
    claimed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        permissions = [("decide_approvalrequest", "Can approve or reject approval requests")]
        constraints = [
            status_constraint("approvalrequest", ApprovalStatus),
            status_constraint("approvalrequest", ApprovalKind, field="kind"),
            # One open request per step: a replayed gate must not ask twice.
            models.UniqueConstraint(fields=["step", "kind"], condition=Q(status=ApprovalStatus.PENDING),
                                    name="approvalrequest_one_pending_per_step"),
        ]
        indexes = [models.Index(fields=["status", "created_at"], name="approval_queue_idx"),
                   models.Index(fields=["status", "escalate_at"], name="approval_escalate_idx")]

    def __str__(self) -> str:
        return f"{self.tool_name} ({self.status}) {self.request_id}"

    @property
    def approve_votes(self) -> list["ApprovalVote"]:
        """The approvals cast so far (from a prefetch when the caller made one)."""
        return [v for v in self.votes.all() if v.decision == VoteDecision.APPROVE]

    @property
    def claim_live(self) -> bool:
        """Someone holds a claim that has not lapsed, on a request still pending."""
        return (self.status == ApprovalStatus.PENDING and self.claimed_by_id is not None
                and self.claimed_until is not None and self.claimed_until > timezone.now())

    @property
    def effective_arguments(self) -> dict[str, object]:
        return self.edited_arguments if self.edited_arguments is not None else self.arguments


class ApprovalGrant(models.Model):
    """A reviewer let one confirm_once tool run unasked in one session, for exactly one argument
    hash or for the calls an explicit argument pattern matches, until it expires (with the turn
    it was granted in, by default) or a reviewer of the team revokes it. Every use is an event."""

    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="grants")
    tool_name = models.CharField(max_length=64)
    # Exactly one of the two: the canonical-JSON SHA-256 of the arguments, or a pattern
    # {argument: glob} (every argument of the call must be named and match; fnmatch, case-sensitive).
    arguments_sha256 = models.CharField(max_length=64, blank=True)
    argument_pattern = models.JSONField(null=True, blank=True)
    # Set: the grant ends with this turn (AGENTOPS_GRANT_SCOPE=turn, the default).
    turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    granted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    source_request = models.ForeignKey(ApprovalRequest, null=True, blank=True, on_delete=models.SET_NULL,
                                       related_name="+")
    expires_at = models.DateTimeField(null=True, blank=True)
    # The approved run spec without its arguments (``tools_app.binding.tool_spec_sha256``): the
    # grant lets calls run only while the tool still runs as the reviewer saw it. Empty (a grant
    # made before it was recorded): it covers nothing, a reviewer is asked.
    tool_spec_sha256 = models.CharField(max_length=64, blank=True)
    uses = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    # Why it ended early when nobody revoked it (the tool changed under it).
    revoked_reason = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=(~Q(arguments_sha256="") & Q(argument_pattern__isnull=True))
                | (Q(arguments_sha256="") & Q(argument_pattern__isnull=False)),
                name="grant_hash_xor_pattern"),
        ]
        indexes = [models.Index(fields=["session", "tool_name"], name="grant_session_tool_idx")]

    def __str__(self) -> str:
        return f"{self.tool_name} for {self.session_id}"


class RiskLevel(models.TextChoices):
    LOW = "low", "Low"
    MEDIUM = "medium", "Medium"
    HIGH = "high", "High"


RISK_RANK = {RiskLevel.LOW: 0, RiskLevel.MEDIUM: 1, RiskLevel.HIGH: 2}


class ApprovalPolicy(models.Model):
    """How one (team, agent, tool) is reviewed. Empty team, agent or tool: any. When several
    enabled policies match a call, the most specific wins (agent, then tool, then team, then
    argument conditions; then the lower ``position``). Conditions: a JSON list of
    ``{"path", "op", "value"}`` that must all hold (``approvals_app/conditions.py``)."""

    name = models.CharField(max_length=120)
    enabled = models.BooleanField(default=True)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(AgentProfile, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    tool_name = models.CharField(max_length=64, blank=True)
    conditions = models.JSONField(default=list, blank=True)
    position = models.PositiveIntegerField(default=100, help_text="Breaks ties: lower first.")
    mode = models.CharField(max_length=16, choices=ApprovalMode.choices, default=ApprovalMode.MUTATING)
    risk = models.CharField(max_length=8, choices=RiskLevel.choices, default=RiskLevel.HIGH)
    required_approvals = models.PositiveSmallIntegerField(default=1)
    reviewer_group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                       help_text="Only its members may decide (empty: the team's reviewers).")
    ttl_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=TTL_VALIDATORS,
        help_text="How long a request may wait for its decision (1 s to 365 days); empty: the tool's or the site's.")
    escalation_group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    escalate_before_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=TTL_VALIDATORS, help_text="Escalate this long before the request expires.")
    omit_arguments = models.BooleanField(default=False, help_text="Notifications leave the arguments out.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["position", "id"]
        verbose_name_plural = "approval policies"
        constraints = [
            models.CheckConstraint(condition=Q(required_approvals__gte=1) & Q(required_approvals__lte=10),
                                   name="approvalpolicy_quorum_range",
                                   violation_error_message="Required approvals must be between 1 and 10."),
            status_constraint("approvalpolicy", RiskLevel, field="risk"),
            status_constraint("approvalpolicy", ApprovalMode, field="mode"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Refuse conditions the evaluator would not understand (the admin's form calls this)."""
        from django.core.exceptions import ValidationError

        from approvals_app.conditions import conditions_errors
        errors = conditions_errors(self.conditions)
        if errors:
            raise ValidationError({"conditions": errors})
        if self.ttl_seconds and self.escalate_before_seconds and self.escalate_before_seconds >= self.ttl_seconds:
            raise ValidationError({"escalate_before_seconds": "Escalation comes before the request expires: "
                                                              "give less than the time to live."})


class VoteDecision(models.TextChoices):
    APPROVE = "approve", "Approve"
    REJECT = "reject", "Reject"


class ApprovalVote(models.Model):
    """One reviewer's decision on a request: a quorum counts the distinct approvers."""

    Decision = VoteDecision

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="votes")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    decision = models.CharField(max_length=16, choices=VoteDecision.choices)
    reason = models.TextField(blank=True)
    seen_sha256 = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["request", "reviewer"], name="approvalvote_one_per_reviewer"),
            status_constraint("approvalvote", VoteDecision, field="decision"),
        ]

    def __str__(self) -> str:
        return f"{self.reviewer_id} {self.decision} {self.request_id}"


class AuditAction(models.TextChoices):
    VIEWED = "viewed", "Opened the request's page"
    DECIDED = "decided", "Decided"
    EDITED = "edited", "Edited the arguments"
    REFUSED = "refused", "Was refused a decision"
    GRANT_USED = "grant_used", "A grant let the call run"
    GRANT_REVOKED = "grant_revoked", "Revoked a grant"
    VOTED = "voted", "Approved (the quorum is not reached yet)"
    CLAIMED = "claimed", "Claimed"
    RELEASED = "released", "Released a claim"
    ESCALATED = "escalated", "Escalated"


class ApprovalAudit(models.Model):
    """Who did what to an approval request, and when. No foreign key to the session or the request:
    the trail outlives them (deleting a session deletes its requests, never their audit)."""

    Action = AuditAction

    request_id = models.UUIDField(db_index=True)
    session_id = models.UUIDField()
    team_id = models.BigIntegerField(null=True)
    action = models.CharField(max_length=16, choices=AuditAction.choices)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    actor_username = models.CharField(max_length=150, blank=True)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [status_constraint("approvalaudit", AuditAction, field="action")]

    def __str__(self) -> str:
        return f"{self.actor_username or '?'} {self.action} {self.request_id}"
