from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from agentops.admin import ChangedFieldsAdmin, ReadOnlyAdmin
from sessions_app import services
from sessions_app.models import AgentProfile, AgentSession, Artifact, Event, Step, Turn


class AgentProfileForm(forms.ModelForm):
    class Meta:
        model = AgentProfile
        fields = "__all__"

    def clean(self) -> dict[str, Any]:
        """Another team's MCP tools are not offered to this agent: every call of one was refused at
        run time, naming the other team's server (an audit attached them through the admin)."""
        cleaned: dict[str, Any] = super().clean() or self.cleaned_data
        team, tools = cleaned.get("team"), cleaned.get("tools")
        if team is not None and tools is not None:
            foreign = sorted(t.name for t in tools.select_related("mcp_tool__server")
                             if hasattr(t, "mcp_tool") and t.mcp_tool.server.team_id != team.pk)
            if foreign:
                self.add_error("tools", f"These MCP tools belong to another team's servers: {', '.join(foreign)}.")
        return cleaned


@admin.register(AgentProfile)
class AgentProfileAdmin(admin.ModelAdmin):
    form = AgentProfileForm
    list_display = ["name", "slug", "team", "model", "base_url", "enabled", "max_tool_calls", "max_tokens",
                    "context_window", "updated_at"]
    list_filter = ["enabled", "team", "model"]
    search_fields = ["name", "slug", "instructions"]
    prepopulated_fields = {"slug": ["name"]}
    filter_horizontal = ["tools"]


class TurnInline(admin.TabularInline):
    model = Turn
    fields = ["index", "status", "input", "error_code", "created_at"]
    readonly_fields = ["index", "status", "input", "error_code", "created_at"]
    extra = 0
    can_delete = False
    show_change_link = True


@admin.register(AgentSession)
class AgentSessionAdmin(ChangedFieldsAdmin):
    list_display = ["id", "title", "agent", "owner", "status", "tool_calls", "model_calls", "last_event_at",
                    "created_at"]
    list_filter = ["status", "team", "agent"]
    search_fields = ["id", "search_title__title", "owner__username"]  # the title through its trigram index
    list_select_related = ["agent", "owner"]
    readonly_fields = ["id", "status", "last_seq", "last_event_at", "tool_calls", "model_calls", "prompt_tokens",
                       "completion_tokens", "wall_seconds", "workspace", "created_at", "updated_at"]
    inlines = [TurnInline]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Sessions start through the dashboard or the API (the service copies the agent's budgets
        and team); an admin-made row had no budgets and could name another team."""
        return False

    def save_model(self, request: HttpRequest, obj: AgentSession, form: Any, change: bool) -> None:
        """Only the changed columns (the engine rewrites the seq and counters with every event: a
        whole-row save put back those read when the edit was posted), then the title's search row.
        The change view runs both in one transaction."""
        super().save_model(request, obj, form, change)
        if not change or "title" in form.changed_data:
            services.session_title_index(obj)


@admin.register(Turn)
class TurnAdmin(ReadOnlyAdmin):
    list_display = ["id", "session", "index", "status", "error_code", "created_at", "finished_at"]
    list_filter = ["status", "error_code"]
    search_fields = ["id", "session__id", "input", "output_text"]
    list_select_related = ["session"]


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = ["id", "turn", "index", "kind", "tool_name", "status", "attempts", "error_code", "created_at"]
    list_filter = ["kind", "status", "tool_name"]
    search_fields = ["id", "call_id", "tool_name", "session__id"]
    list_select_related = ["turn"]


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["session", "seq", "type", "created_at"]
    list_filter = ["type"]
    search_fields = ["session__id", "type"]
    list_select_related = ["session"]


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    list_display = ["path", "session", "size", "sha256", "created_at"]
    search_fields = ["path", "sha256", "session__id"]
    list_select_related = ["session"]
