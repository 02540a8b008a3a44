"""Durable state of agent work: profiles, sessions, turns, steps, the event log, artifacts.

Every status field has a ``Status`` (TextChoices), a ``TRANSITIONS`` table and a database
CheckConstraint; status writes go through the transition services in ``services.py``.
"""

import uuid
from typing import ClassVar
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from agentops.domain import StateMachine, status_constraint
from agentops.models import Team
from tools_app.models import ApprovalMode, ToolDefinition


def _slug_list_validator(value: object) -> None:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValidationError("Expected a list of strings.")


class AgentProfile(models.Model):
    """An agent as admins configure it: instructions, model endpoint, tools and budgets."""

    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=64, unique=True)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="agents")
    instructions = models.TextField(blank=True)
    base_url = models.CharField(max_length=300, blank=True,
                                help_text="OpenAI-compatible endpoint; empty = OPENAI_BASE_URL or OpenAI.")
    model = models.CharField(max_length=120, default="gpt-4o-mini")
    api_key_env = models.CharField(max_length=80, default="OPENAI_API_KEY",
                                   help_text="Name of the environment variable holding the API key.")
    tools = models.ManyToManyField(ToolDefinition, blank=True, related_name="agents")
    starter_files = models.JSONField(default=dict, blank=True,
                                     help_text="Files (path → content) every new workspace starts with.")
    max_tool_calls = models.PositiveIntegerField(null=True, blank=True)
    max_model_calls = models.PositiveIntegerField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    max_wall_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Compaction (``sessions_app/engine/context.py``): before a model call whose prompt would cross
    # ``compaction_threshold`` of the window, the older history is summarised; the last
    # ``keep_recent_steps`` steps stay whole. No window: never compacted.
    context_window = models.PositiveIntegerField(null=True, blank=True,
                                                 help_text="The context window in tokens; empty = never compact.")
    compaction_threshold = models.FloatField(default=0.8,
                                             help_text="Compact before a call whose prompt would cross this share "
                                                       "of the window.")
    keep_recent_steps = models.PositiveIntegerField(default=6,
                                                    help_text="Steps kept whole in the prompt after a compaction.")
    verification_rounds = models.PositiveIntegerField(
        default=2, help_text="Re-work rounds after a verification finds acceptance criteria unmet.")
    enabled = models.BooleanField(default=True)
    # The integration's own key/value pairs (the OpenAI Agents API's agent metadata), echoed back.
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(max_tool_calls__isnull=True) | Q(max_tool_calls__gte=0))
                & (Q(max_model_calls__isnull=True) | Q(max_model_calls__gte=0))
                & (Q(max_tokens__isnull=True) | Q(max_tokens__gte=0))
                & (Q(max_wall_seconds__isnull=True) | Q(max_wall_seconds__gte=0)),
                name="agentprofile_budgets_non_negative",
            ),
            models.CheckConstraint(condition=Q(compaction_threshold__gt=0) & Q(compaction_threshold__lte=1),
                                   name="agentprofile_compaction_threshold_range"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.api_key_env and self.api_key_env not in settings.AGENTOPS_MODEL_KEY_ENVS:
            raise ValidationError({"api_key_env": f"Not an allowed key variable; allowed: "
                                                  f"{', '.join(settings.AGENTOPS_MODEL_KEY_ENVS)} "
                                                  "(setting AGENTOPS_MODEL_KEY_ENVS)."})
        errors: dict[str, str] = {}
        if not isinstance(self.starter_files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.starter_files.items()
        ):
            errors["starter_files"] = "Expected an object mapping paths to text."
        elif any(k.startswith("/") or ".." in k.split("/") or not k.strip() for k in self.starter_files):
            # the engine skips them (nothing is written outside the workspace), silently: say so here
            errors["starter_files"] = "Paths are relative to the workspace, without '..'."
        if self.base_url and urlsplit(self.base_url).scheme not in ("http", "https"):
            errors["base_url"] = "An http:// or https:// URL of an OpenAI-compatible endpoint (or empty: the default)."
        if not isinstance(self.metadata, dict):
            errors["metadata"] = "A JSON object of key → value."
        if errors:
            raise ValidationError(errors)


class SessionStatus(models.TextChoices):
    IDLE = "idle", "Idle"
    IN_PROGRESS = "in_progress", "In progress"
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    REQUIRES_ACTION = "requires_action", "Requires action"
    FAILED = "failed", "Failed"


class AgentSession(StateMachine, models.Model):
    Status = SessionStatus

    TRANSITIONS: ClassVar = {
        Status.IDLE: frozenset({Status.IN_PROGRESS}),
        Status.IN_PROGRESS: frozenset({Status.AWAITING_APPROVAL, Status.REQUIRES_ACTION, Status.IDLE,
                                       Status.FAILED}),
        Status.AWAITING_APPROVAL: frozenset({Status.IN_PROGRESS, Status.IDLE, Status.FAILED}),
        Status.REQUIRES_ACTION: frozenset({Status.IN_PROGRESS, Status.IDLE, Status.FAILED}),
        Status.FAILED: frozenset({Status.IN_PROGRESS}),
    }

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(AgentProfile, on_delete=models.PROTECT, related_name="sessions")
    # The agent's team when the session started: moving an agent later does not move its sessions.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="sessions")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="agent_sessions")
    title = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.IDLE)
    # Pinned context: kept verbatim and always first in the prompt, never compacted.
    requirements = models.JSONField(default=list, blank=True, validators=[_slug_list_validator])
    prohibitions = models.JSONField(default=list, blank=True, validators=[_slug_list_validator])
    acceptance_criteria = models.JSONField(default=list, blank=True, validators=[_slug_list_validator])
    # Bumped by every edit of the pinned context: a worker that holds the prompt in memory sees the
    # change in what its next write returns and rebuilds the prompt (``record.SESSION_FIELDS``).
    pinned_revision = models.PositiveIntegerField(default=0)
    # An operator asked to compact: the next model call is preceded by a compaction (cleared by it).
    compact_requested = models.BooleanField(default=False)
    # The last completed turn ended with acceptance criteria unmet (its verdicts are on the turn).
    criteria_unmet = models.BooleanField(default=False)
    metadata = models.JSONField(default=dict, blank=True)
    # Budgets copied from the profile at creation (and overridable per session).
    max_tool_calls = models.PositiveIntegerField(null=True, blank=True)
    max_model_calls = models.PositiveIntegerField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    max_wall_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Usage counters.
    tool_calls = models.PositiveIntegerField(default=0)
    model_calls = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    wall_seconds = models.FloatField(default=0)
    workspace = models.CharField(max_length=500, blank=True)
    # The last allocated event seq: event_record increments it under the row lock.
    last_seq = models.PositiveBigIntegerField(default=0)
    last_event_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        permissions = [("operate_agentsession", "Can start, drive and cancel agent sessions")]
        constraints = [
            status_constraint("agentsession", SessionStatus),
            models.CheckConstraint(
                condition=(Q(max_tool_calls__isnull=True) | Q(max_tool_calls__gte=0))
                & (Q(max_tokens__isnull=True) | Q(max_tokens__gte=0)),
                name="agentsession_budgets_non_negative",
            ),
        ]
        indexes = [models.Index(fields=["status", "-created_at"]), models.Index(fields=["-last_event_at"]),
                   # The lists' order (newest first, id breaks ties): a page is an index walk, not a sort.
                   models.Index(fields=["-created_at", "-id"], name="session_newest_idx")]

    def __str__(self) -> str:
        return self.title or f"session {str(self.id)[:8]}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def has_sandbox(self) -> bool:
        """False for a session started without one (the OpenAI wire's ``environment: none``, kept in
        ``metadata.agentops_environment``): no workspace, so no sandbox host is ever pinned for it."""
        environment = (self.metadata or {}).get("agentops_environment")
        return not (isinstance(environment, dict) and environment.get("type") == "none")


class SessionTitle(models.Model):
    """A session's title as the session search reads it, in a row of its own (none for no title).

    The session row is rewritten with every event (``last_seq``, the counters); on PostgreSQL a
    rewrite that is not a HOT update enters the new row version into every index of the table, and
    the title's trigram index (migration 0004) took ~20 entries and ~10 KB of WAL each time: 6,000
    such updates of the benchmark's sessions wrote 71 MB of WAL with it, 5-10 MB without. Here the
    trigram index (migration 0010) is written when the title is: at the session's start
    (``services``) and on an edit in the admin."""

    session = models.OneToOneField(AgentSession, on_delete=models.CASCADE, primary_key=True,
                                   related_name="search_title")
    title = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.title


class TurnStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    REQUIRES_ACTION = "requires_action", "Requires action"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


# A turn in one of these holds its session: at most one per session (a partial unique index).
TURN_ACTIVE = (TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.AWAITING_APPROVAL, TurnStatus.REQUIRES_ACTION)


class Turn(StateMachine, models.Model):
    Status = TurnStatus

    ACTIVE: ClassVar = TURN_ACTIVE
    TRANSITIONS: ClassVar = {
        Status.QUEUED: frozenset({Status.RUNNING, Status.FAILED, Status.CANCELLED}),
        Status.RUNNING: frozenset({Status.AWAITING_APPROVAL, Status.REQUIRES_ACTION, Status.COMPLETED,
                                   Status.FAILED, Status.CANCELLED}),
        Status.AWAITING_APPROVAL: frozenset({Status.RUNNING, Status.FAILED, Status.CANCELLED}),
        Status.REQUIRES_ACTION: frozenset({Status.RUNNING, Status.FAILED, Status.CANCELLED}),
        Status.COMPLETED: frozenset(),
        Status.FAILED: frozenset({Status.QUEUED}),  # an operator retries a retryable failure (turn_retry)
        Status.CANCELLED: frozenset(),
    }

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: turn_unique_index (session, index) serves it.
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, db_index=False, related_name="turns")
    index = models.PositiveIntegerField()
    input = models.TextField()
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.QUEUED)
    output_text = models.TextField(blank=True)
    # The verification's per-criterion verdicts ({criterion, met, evidence}) of the final answer;
    # ``criteria_unmet``: the turn completed with some unmet after its re-work rounds.
    verdicts = models.JSONField(null=True, blank=True)
    criteria_unmet = models.BooleanField(default=False)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    retryable = models.BooleanField(default=False)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    idempotency_key = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["session_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["session", "index"], name="turn_unique_index"),
            # At most one active turn per session, enforced by the database.
            models.UniqueConstraint(fields=["session"], condition=Q(status__in=list(TURN_ACTIVE)),
                                    name="turn_one_active_per_session"),
            status_constraint("turn", TurnStatus),
        ]

    def __str__(self) -> str:
        return f"turn {self.index} of {self.session_id}"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE


# A session's status follows its turn's: ``turn_transition`` moves both together.
SESSION_STATUS_OF_TURN = {
    TurnStatus.QUEUED: SessionStatus.IN_PROGRESS,
    TurnStatus.RUNNING: SessionStatus.IN_PROGRESS,
    TurnStatus.AWAITING_APPROVAL: SessionStatus.AWAITING_APPROVAL,
    TurnStatus.REQUIRES_ACTION: SessionStatus.REQUIRES_ACTION,
    TurnStatus.COMPLETED: SessionStatus.IDLE,
    TurnStatus.CANCELLED: SessionStatus.IDLE,
    TurnStatus.FAILED: SessionStatus.FAILED,
}


class StepKind(models.TextChoices):
    MODEL = "model", "Model call"
    TOOL = "tool", "Tool call"
    # A model call that summarises older history (``engine/compaction.py``): ``arguments`` holds
    # the range it replaces and the estimate that asked for it, ``result`` the summary and the
    # tokens before/after. Recovered like a model call.
    COMPACTION = "compaction", "Compaction"
    # A model call that judges the turn's answer against the acceptance criteria
    # (``engine/verification.py``): ``arguments`` the answer and the round, ``result`` the verdicts.
    VERIFICATION = "verification", "Verification"


# Steps that call the model: claimed with a lease by the gateway, retried after a crash.
MODEL_KINDS = (StepKind.MODEL, StepKind.COMPACTION, StepKind.VERIFICATION)


class StepStatus(models.TextChoices):
    PLANNED = "planned", "Planned"
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    APPROVED = "approved", "Approved"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"
    IN_DOUBT = "in_doubt", "In doubt"


class Step(StateMachine, models.Model):
    Kind = StepKind

    Status = StepStatus

    SETTLED: ClassVar = (Status.COMPLETED, Status.FAILED, Status.REJECTED, Status.EXPIRED, Status.CANCELLED)
    TRANSITIONS: ClassVar = {
        Status.PLANNED: frozenset({Status.AWAITING_APPROVAL, Status.APPROVED, Status.RUNNING, Status.FAILED,
                                   Status.CANCELLED}),
        Status.AWAITING_APPROVAL: frozenset({Status.APPROVED, Status.REJECTED, Status.EXPIRED, Status.CANCELLED}),
        # approved → awaiting_approval: what would run changed after the approval (tool edited,
        # limits changed): the approval is invalidated and a reviewer asked again.
        Status.APPROVED: frozenset({Status.RUNNING, Status.CANCELLED, Status.FAILED, Status.AWAITING_APPROVAL}),
        # A lease expired and the effect check says a retry is safe: a model step goes back to
        # planned, an approved tool step back to approved (it was approved already; never ask twice).
        Status.RUNNING: frozenset({Status.COMPLETED, Status.FAILED, Status.IN_DOUBT, Status.CANCELLED, Status.PLANNED,
                                   Status.APPROVED}),
        # in_doubt: a reviewer decides retry (approved), mark done (completed) or fail.
        Status.IN_DOUBT: frozenset({Status.APPROVED, Status.COMPLETED, Status.FAILED, Status.CANCELLED}),
        Status.COMPLETED: frozenset(),
        Status.FAILED: frozenset(),
        Status.REJECTED: frozenset(),
        Status.EXPIRED: frozenset(),
        Status.CANCELLED: frozenset(),
    }

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: step_call_idx (session, call_id) serves it.
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, db_index=False, related_name="steps")
    # No index of its own: step_unique_index (turn, index) serves it.
    turn = models.ForeignKey(Turn, on_delete=models.CASCADE, db_index=False, related_name="steps")
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=12, choices=Kind.choices)
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.PLANNED)
    # Tool steps.
    tool_name = models.CharField(max_length=64, blank=True)
    call_id = models.CharField(max_length=100, blank=True)
    arguments = models.JSONField(default=dict, blank=True)
    approval_mode = models.CharField(max_length=16, choices=ApprovalMode.choices, blank=True)
    # Model steps: the assistant message as the model sent it (content + tool_calls).
    message = models.JSONField(default=dict, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    idempotency_key = models.CharField(max_length=200, blank=True)
    # Tool steps a reviewer is asked about: the model's check of the call against the session's
    # prohibitions ([{prohibition, violated, evidence}]), shown next to the arguments.
    checks = models.JSONField(null=True, blank=True)
    # Effect evidence: the workspace manifest taken before a mutating command started.
    manifest = models.JSONField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["turn_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["turn", "index"], name="step_unique_index"),
            status_constraint("step", StepKind, field="kind"),
            status_constraint("step", StepStatus),
        ]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="step_lease_idx"),
            models.Index(fields=["session", "call_id"], name="step_call_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} step {self.index} ({self.tool_name or 'model'})"

    @property
    def is_settled(self) -> bool:
        return self.status in self.SETTLED


class Event(models.Model):
    """The append-only timeline: ``(session, seq)`` unique and gap-free per session."""

    # No index of its own: event_unique_seq (session, seq) serves it; one index less per event.
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, db_index=False, related_name="events")
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=64)
    turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="event_unique_seq")]

    def __str__(self) -> str:
        return f"#{self.seq} {self.type}"

    def as_dict(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "type": self.type,
            "session_id": str(self.session_id),
            "turn_id": str(self.turn_id) if self.turn_id else None,
            "step_id": str(self.step_id) if self.step_id else None,
            "payload": self.payload,
            "created_at": self.created_at.isoformat(),
        }


class Artifact(models.Model):
    """A file an agent published; copied out of the workspace so it outlives it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="artifacts")
    turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.SET_NULL, related_name="artifacts")
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.SET_NULL, related_name="artifacts")
    path = models.CharField(max_length=500)
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    content_type = models.CharField(max_length=120, default="application/octet-stream")
    storage_path = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session_id", "created_at"]
        constraints = [
            models.UniqueConstraint(fields=["session", "path", "sha256"], name="artifact_unique_content"),
        ]

    def __str__(self) -> str:
        return self.path
