from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from agentops.admin import ChangedFieldsAdmin
from mcp_app.models import McpServer, McpTool
from mcp_app.services import mcp_server_delete, mcp_server_refresh, mcp_tools_apply_suggested_modes


class McpToolInline(admin.TabularInline):
    model = McpTool
    extra = 0
    can_delete = False
    fields = ("definition", "remote_name", "suggested_mode", "present", "schema_sha256", "updated_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(McpServer)
class McpServerAdmin(ChangedFieldsAdmin):
    """Each tool's approval mode is set on its Tool definition (the suggestion is shown here)."""

    list_display = ["name", "team", "transport", "enabled", "status", "status_message", "checked_at"]
    list_filter = ["team", "transport", "status", "enabled"]
    search_fields = ["name", "url"]
    readonly_fields = ["status", "status_message", "checked_at", "created_at", "updated_at"]
    inlines = [McpToolInline]
    actions = ["refresh_tools", "apply_suggested_modes"]

    def delete_model(self, request: HttpRequest, obj: McpServer) -> None:
        mcp_server_delete(server_id=obj.pk)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            mcp_server_delete(server_id=server.pk)

    @admin.action(description="Discover tools (list the server's tools and update their definitions)",
                  permissions=["change"])
    def refresh_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            report = mcp_server_refresh(server_id=server.id)
            if report.error:
                self.message_user(request, f"{server.name}: {report.error}", messages.ERROR)
            else:
                self.message_user(request, f"{server.name}: {len(report.created)} new, {len(report.changed)} "
                                           f"changed, {len(report.removed)} removed, {len(report.skipped)} skipped, "
                                           f"{report.invalidated} pending approvals invalidated")
                for note in report.notes:
                    self.message_user(request, f"{server.name}: {note}", messages.WARNING)

    @admin.action(description="Set each tool's approval mode to what its annotations suggest", permissions=["change"])
    def apply_suggested_modes(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            changed = mcp_tools_apply_suggested_modes(server_id=server.id)
            self.message_user(request, f"{server.name}: {changed} tools changed their approval mode")
