from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from agentops.models import ApiToken, Team, TeamMembership


class ReadOnlyAdmin(admin.ModelAdmin):
    """An audit trail: visible, never edited or deleted from the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "user__username", "name"]
    readonly_fields = ["prefix", "token_sha256", "created_at", "last_used_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are minted with `manage.py agentops_token`, shown once


class TeamMembershipInline(admin.TabularInline):
    model = TeamMembership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [TeamMembershipInline]


@admin.register(TeamMembership)
class TeamMembershipAdmin(admin.ModelAdmin):
    list_display = ["team", "user", "role", "created_at"]
    list_filter = ["team", "role"]
    search_fields = ["team__slug", "user__username"]
    list_select_related = ["team", "user"]
    autocomplete_fields = ["user", "team"]
