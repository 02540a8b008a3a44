from django.contrib import admin
from django.http import HttpRequest

from tools_app.models import Outbox, ToolDefinition


@admin.register(ToolDefinition)
class ToolDefinitionAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "approval_mode", "network", "timeout_seconds", "max_attempts", "idempotent",
                    "enabled"]
    list_filter = ["kind", "approval_mode", "network", "enabled", "idempotent"]
    search_fields = ["name", "description"]
    list_editable = ["approval_mode", "enabled"]


@admin.register(Outbox)
class OutboxAdmin(admin.ModelAdmin):
    list_display = ["to", "subject", "status", "idempotency_key", "created_at", "sent_at"]
    list_filter = ["status"]
    search_fields = ["to", "subject", "idempotency_key"]
    readonly_fields = ["idempotency_key", "to", "subject", "body", "status", "sent_at", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
