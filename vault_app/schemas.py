from datetime import datetime
from uuid import UUID

from ninja import Field, Schema

from agentops.schemas import STRICT_FIELDS, Out


class SecretCreateIn(Schema):
    model_config = STRICT_FIELDS
    team: str = Field(..., min_length=1, max_length=100, description="The team's slug.")
    name: str = Field(..., min_length=1, max_length=100)
    value: str = Field(..., description="Write-only: never returned by any endpoint.")
    allowed_tools: list[str] = Field(default_factory=list, max_length=1000)
    description: str = Field("", max_length=500)
    expires_at: datetime | None = None


class SecretUpdateIn(Schema):
    model_config = STRICT_FIELDS
    value: str | None = Field(None, description="A new value (write-only); absent keeps the current one.")
    allowed_tools: list[str] | None = Field(None, max_length=1000)
    description: str | None = Field(None, max_length=500)
    expires_at: datetime | None = None
    clear_expiry: bool = False


class SecretOut(Out):
    id: UUID
    team: str
    name: str
    description: str
    allowed_tools: list[str]
    expires_at: datetime | None
    expired: bool
    value_updated_at: datetime
    created_by: str | None
    created_at: datetime
    updated_at: datetime


class SecretPageOut(Out):
    items: list[SecretOut]
    next_cursor: str | None
