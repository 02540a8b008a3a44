from django.contrib import admin
from django.http import HttpRequest

from agentops.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "user__username", "name"]
    readonly_fields = ["prefix", "token_sha256", "created_at", "last_used_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are minted with `manage.py agentops_token`, shown once
