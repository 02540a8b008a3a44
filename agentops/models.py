"""API tokens for integrations: only a SHA-256 of the token is stored."""

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, help_text="First characters, to recognise a token in lists.")
    token_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class IdempotencyRecord(models.Model):
    """The response to a POST made with an ``Idempotency-Key``: a replay gets it back unchanged."""

    scope = models.CharField(max_length=64, help_text="Hash of the caller's credentials.")
    key = models.CharField(max_length=200)
    request_sha256 = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    content_type = models.CharField(max_length=100, blank=True)
    body = models.BinaryField(default=b"")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "key"], name="idempotency_unique_key")]
        indexes = [models.Index(fields=["created_at"])]

    def __str__(self) -> str:
        return self.key


class TeamRole(models.TextChoices):
    OPERATOR = "operator", "Operator"
    REVIEWER = "reviewer", "Reviewer"
    BOTH = "both", "Operator and reviewer"


class Team(models.Model):
    """Who may see and act on which agents and sessions: everything an operator or reviewer reads
    goes through a team-scoped selector (``agentops/teams.py``)."""

    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=64, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="TeamMembership", related_name="teams")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TeamMembership(models.Model):
    Role = TeamRole

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships")
    role = models.CharField(max_length=16, choices=TeamRole.choices, default=TeamRole.OPERATOR)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team", "user"]
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="teammembership_unique"),
            models.CheckConstraint(condition=models.Q(role__in=TeamRole.values), name="teammembership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"
