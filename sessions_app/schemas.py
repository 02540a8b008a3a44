from datetime import datetime
from typing import Any
from uuid import UUID

from ninja import Field, Schema

from agentops.schemas import STRICT_FIELDS, Out
from sessions_app.services import BUDGET_MAX, INPUT_MAX_CHARS


class SessionCreateIn(Schema):
    model_config = STRICT_FIELDS
    agent: str = Field(..., min_length=1, max_length=64)
    input: str | None = Field(None, max_length=INPUT_MAX_CHARS)
    title: str | None = Field(None, max_length=200)
    pinned: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class SessionPinnedIn(Schema):
    """The pinned fields to replace; a field left out stays as it is, null or [] clears it; an
    unknown one is refused."""

    model_config = STRICT_FIELDS

    requirements: list[str] | None = None
    prohibitions: list[str] | None = None
    acceptance_criteria: list[str] | None = None


class TurnCreateIn(Schema):
    input: str = Field(..., min_length=1, max_length=INPUT_MAX_CHARS)


class BudgetRaiseIn(Schema):
    """The budgets to raise; a field left out is kept, null lifts the limit, another name is refused."""

    model_config = STRICT_FIELDS
    # strict: "300000", 4000.0 and true are refused, as on session create
    max_tool_calls: int | None = Field(None, ge=0, le=BUDGET_MAX, strict=True)
    max_model_calls: int | None = Field(None, ge=0, le=BUDGET_MAX, strict=True)
    max_tokens: int | None = Field(None, ge=0, le=BUDGET_MAX, strict=True)
    max_wall_seconds: int | None = Field(None, ge=0, le=BUDGET_MAX, strict=True)


class ToolOutputIn(Schema):
    call_id: str = Field(..., min_length=1, max_length=100)
    output: Any
    success: bool = True


class UsageOut(Out):
    tool_calls: int
    model_calls: int
    prompt_tokens: int
    completion_tokens: int
    wall_seconds: float


class SessionOut(Out):
    id: UUID
    agent: str
    owner: str
    title: str
    status: str
    pinned: dict[str, list[str]]
    pinned_revision: int
    compact_requested: bool
    criteria_unmet: bool
    budget: dict[str, int | None]
    usage: UsageOut
    metadata: dict[str, Any]
    last_seq: int
    created_at: datetime
    updated_at: datetime


class StepOut(Out):
    id: UUID
    index: int
    kind: str
    status: str
    tool_name: str
    call_id: str
    arguments: dict[str, Any]
    approval_mode: str
    result: dict[str, Any] | None
    error_code: str
    error_message: str
    attempts: int
    started_at: datetime | None
    finished_at: datetime | None


class TurnOut(Out):
    id: UUID
    session_id: UUID
    index: int
    input: str
    status: str
    output_text: str
    verdicts: list[dict[str, Any]] | None
    criteria_unmet: bool
    error_code: str
    error_message: str
    retryable: bool
    prompt_tokens: int
    completion_tokens: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class TurnDetailOut(TurnOut):
    steps: list[StepOut]


class SessionCreatedOut(SessionOut):
    turn: TurnOut | None = None


class EventOut(Out):
    seq: int
    type: str
    turn_id: UUID | None
    step_id: UUID | None
    payload: dict[str, Any]
    created_at: datetime


class EventPageOut(Out):
    items: list[EventOut]
    next_after: int


class SessionPageOut(Out):
    items: list[SessionOut]
    next_cursor: str | None


class ArtifactOut(Out):
    id: UUID
    path: str
    size: int
    sha256: str
    content_type: str
    turn_id: UUID | None
    created_at: datetime


class ToolOut(Out):
    name: str
    description: str
    kind: str
    parameters_schema: dict[str, Any]
    approval_mode: str
    network: str
    timeout_seconds: int
    idempotent: bool
    enabled: bool


class AgentOut(Out):
    slug: str
    name: str
    model: str
    tools: list[str]
    budget: dict[str, int | None]
