from django.contrib import admin

from agentops.admin import ReadOnlyAdmin
from approvals_app.models import ApprovalAudit, ApprovalGrant, ApprovalRequest


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ["request_id", "tool_name", "kind", "status", "decision", "session", "decided_by", "created_at",
                    "decided_at"]
    list_filter = ["status", "kind", "tool_name", "decision", "risk"]
    search_fields = ["request_id", "tool_name", "session__id", "decided_by__username", "reason"]
    list_select_related = ["session", "decided_by"]


@admin.register(ApprovalGrant)
class ApprovalGrantAdmin(ReadOnlyAdmin):
    list_display = ["tool_name", "session", "granted_by", "created_at", "revoked_at"]
    list_filter = ["tool_name"]
    search_fields = ["tool_name", "session__id"]


@admin.register(ApprovalAudit)
class ApprovalAuditAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "request_id", "action", "actor_username", "team_id"]
    list_filter = ["action"]
    search_fields = ["request_id", "session_id", "actor_username"]
