from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from agentops.models import ApiToken


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
