from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from agentops.admin import ChangedFieldsAdmin
from hosts_app.models import AgentHostPolicy, RunnerResult, SandboxHost, SessionPlacement


@admin.register(SandboxHost)
class SandboxHostAdmin(ChangedFieldsAdmin):
    list_display = ["name", "kind", "pool", "status", "capacity", "team", "last_heartbeat_at"]
    list_filter = ["kind", "pool", "status"]
    # Status moves through the services (heartbeat, sweep, revoke); the token is never shown.
    # Whether it has a job-signing key pair (a runner from before has none: it needs a new token).
    readonly_fields = ["status", "last_heartbeat_at", "versions", "self_test", "token_hash", "signs_jobs",
                       "revoked_at", "created_at", "updated_at"]
    fields = ["name", "kind", "pool", "labels", "capacity", "team", *readonly_fields]

    @admin.display(boolean=True, description="Signs its jobs")
    def signs_jobs(self, obj: SandboxHost) -> bool:
        return bool(obj.public_key)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        if (obj is None or obj.kind != SandboxHost.Kind.RUNNER) and "kind" in form.base_fields:
            # a runner gets its token once, from the API or the CLI: no runner is made here
            field: Any = form.base_fields["kind"]
            field.choices = [(v, label) for v, label in field.choices if v != SandboxHost.Kind.RUNNER]
            field.help_text = "A customer runner is created with POST /api/runners, which shows its token once."
        return form


@admin.register(AgentHostPolicy)
class AgentHostPolicyAdmin(admin.ModelAdmin):
    list_display = ["agent", "pool", "labels"]
    fields = ["agent", "pool", "labels"]


@admin.register(SessionPlacement)
class SessionPlacementAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # placed by the engine (every field read-only here: an add could only fail)

    list_display = ["session", "host", "pinned_at", "moved_at"]
    readonly_fields = ["session", "host", "pinned_at", "moved_at", "moved_by"]
    fields = list(readonly_fields)


@admin.register(RunnerResult)
class RunnerResultAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # posted by runners

    list_display = ["job_id", "host", "received_at", "deliveries"]
    readonly_fields = ["job_id", "host", "step", "result", "received_at", "deliveries"]
    fields = list(readonly_fields)
