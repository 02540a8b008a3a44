from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from agentops.admin import ReadOnlyAdmin
from agentops.domain import DomainError
from approvals_app.grants import grant_revoke
from approvals_app.models import ApprovalAudit, ApprovalGrant, ApprovalPolicy, ApprovalRequest, ApprovalVote


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ["request_id", "tool_name", "kind", "status", "decision", "session", "decided_by", "created_at",
                    "decided_at"]
    list_filter = ["status", "kind", "tool_name", "decision", "risk"]
    search_fields = ["request_id", "tool_name", "session__id", "decided_by__username", "reason"]
    list_select_related = ["session", "decided_by"]


@admin.register(ApprovalGrant)
class ApprovalGrantAdmin(ReadOnlyAdmin):
    list_display = ["tool_name", "session", "arguments_sha256", "argument_pattern", "uses", "granted_by", "created_at",
                    "expires_at", "revoked_at", "revoked_by"]
    list_filter = ["tool_name"]
    search_fields = ["tool_name", "session__id"]
    actions = ["revoke"]

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        """Revoking needs the change permission on grants (the list itself stays read-only)."""
        return request.user.has_perm("approvals_app.change_approvalgrant")

    @admin.action(description="Revoke the selected grants", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApprovalGrant]) -> None:
        revoked = 0
        for grant in queryset:
            try:
                grant_revoke(grant_id=grant.pk, actor=request.user)  # type: ignore[arg-type]
            except DomainError as exc:
                self.message_user(request, f"{grant}: {exc.message}", level=messages.ERROR)
            else:
                revoked += 1
        self.message_user(request, f"Revoked {revoked} grant(s).")


@admin.register(ApprovalAudit)
class ApprovalAuditAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "request_id", "action", "actor_username", "team_id"]
    list_filter = ["action"]
    search_fields = ["request_id", "session_id", "actor_username"]


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(admin.ModelAdmin):
    """Admins manage policies here; the form validates the conditions (``ApprovalPolicy.clean``)."""

    list_display = ["name", "enabled", "team", "agent", "tool_name", "mode", "risk", "required_approvals",
                    "reviewer_group", "ttl_seconds", "escalate_before_seconds", "position"]
    list_filter = ["enabled", "mode", "risk", "team"]
    search_fields = ["name", "tool_name"]
    list_select_related = ["team", "agent", "reviewer_group"]
    fields = ["name", "enabled", "team", "agent", "tool_name", "conditions", "position", "mode", "risk",
              "required_approvals", "reviewer_group", "ttl_seconds", "escalation_group", "escalate_before_seconds",
              "omit_arguments"]


@admin.register(ApprovalVote)
class ApprovalVoteAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "request", "reviewer", "decision"]
    list_filter = ["decision"]
    list_select_related = ["request", "reviewer"]
