from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Field, Schema

from agentops.schemas import Out


class ApprovalDecideIn(Schema):
    decision: Literal["approve", "reject", "retry", "mark_done", "fail"]
    reason: str = Field("", max_length=5000)
    arguments_sha256: str | None = Field(None, min_length=64, max_length=64)
    arguments: dict[str, Any] | None = None
    remember: bool = False
    # With remember: the calls the grant covers, {argument: glob}; absent = these exact arguments.
    grant_pattern: dict[str, str] | None = None


class ApprovalOut(Out):
    request_id: UUID
    kind: str
    session_id: UUID
    turn_id: UUID
    step_id: UUID
    tool_name: str
    arguments: dict[str, Any]
    arguments_sha256: str
    approval_mode: str
    risk: str
    risk_note: str
    sandbox_backend: str
    network_policy: str
    preview: str
    status: str
    decision: str
    decided_by: str | None
    decided_at: datetime | None
    reason: str
    edited_arguments: dict[str, Any] | None
    edited_by: str | None
    remember: bool
    expires_at: datetime | None
    created_at: datetime
    # The reviewer's workflow (issue 17): the policy that applied and why, its quorum, the live claim.
    policy: str
    required_approvals: int
    priority: int
    claimed_by: str | None
    claimed_until: datetime | None
    lineage: dict[str, Any] | None = None  # a subagent's request: root session, parent step, agent path
    run_spec: dict[str, Any] | None = None  # GET /api/approvals/{id} only: what arguments_sha256 hashes


class ApprovalPageOut(Out):
    items: list[ApprovalOut]
    next_cursor: str | None


class GrantOut(Out):
    grant_id: int
    session_id: UUID
    tool_name: str
    arguments_sha256: str | None
    argument_pattern: dict[str, str] | None
    turn_id: UUID | None
    expires_at: datetime | None
    uses: int
    last_used_at: datetime | None
    live: bool
    granted_by: str | None
    revoked_at: datetime | None
    revoked_by: str | None
    source_request_id: UUID | None
    created_at: datetime
