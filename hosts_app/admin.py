from django.contrib import admin

from agentops.admin import ChangedFieldsAdmin
from hosts_app.models import AgentHostPolicy, RunnerResult, SandboxHost, SessionPlacement


@admin.register(SandboxHost)
class SandboxHostAdmin(ChangedFieldsAdmin):
    list_display = ["name", "kind", "pool", "status", "capacity", "team", "last_heartbeat_at"]
    list_filter = ["kind", "pool", "status"]
    # Status moves through the services (heartbeat, sweep, revoke); the token is never shown.
    readonly_fields = ["status", "last_heartbeat_at", "versions", "self_test", "token_hash", "signing_key",
                       "revoked_at", "created_at", "updated_at"]
    fields = ["name", "kind", "pool", "labels", "capacity", "team", *readonly_fields]


@admin.register(AgentHostPolicy)
class AgentHostPolicyAdmin(admin.ModelAdmin):
    list_display = ["agent", "pool", "labels"]
    fields = ["agent", "pool", "labels"]


@admin.register(SessionPlacement)
class SessionPlacementAdmin(admin.ModelAdmin):
    list_display = ["session", "host", "pinned_at", "moved_at"]
    readonly_fields = ["session", "host", "pinned_at", "moved_at", "moved_by"]
    fields = list(readonly_fields)


@admin.register(RunnerResult)
class RunnerResultAdmin(admin.ModelAdmin):
    list_display = ["job_id", "host", "received_at", "deliveries"]
    readonly_fields = ["job_id", "host", "step", "result", "received_at", "deliveries"]
    fields = list(readonly_fields)
