from datetime import datetime

from agentops.schemas import Out


class McpToolOut(Out):
    name: str
    remote_name: str
    approval_mode: str
    suggested_mode: str
    present: bool


class McpServerOut(Out):
    name: str
    team: str
    transport: str
    enabled: bool
    status: str
    status_message: str
    checked_at: datetime | None
    tools: list[McpToolOut]
