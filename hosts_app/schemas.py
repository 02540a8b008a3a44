from datetime import datetime
from typing import Any

from ninja import Field, Schema

from agentops.schemas import Out


class HostOut(Out):
    name: str
    kind: str
    pool: str
    labels: list[str]
    capacity: int
    status: str
    last_heartbeat_at: datetime | None
    versions: dict[str, Any]
    self_test: dict[str, Any]
    team: str | None
    active_sessions: int
    running_steps: int


class SessionHostOut(Out):
    session_id: str
    host: str | None
    kind: str | None
    status: str | None


class SessionMoveIn(Schema):
    host: str


class RunnerCreateIn(Schema):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    team: str
    pool: str = Field(default="default", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    labels: list[str] = []
    capacity: int = Field(default=8, ge=1, le=10000)


class RunnerCreatedOut(Out):
    name: str
    team: str
    token: str
