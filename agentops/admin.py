from typing import Any, cast

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from agentops.models import ApiToken, Team, TeamMembership
from agentops.parser import UnsafeJSON, json_loads_strict
from agentops.services import api_tokens_revoke


def changed_fields(obj: Any, form: Any) -> list[str]:
    """The columns an admin form changed, for ``save(update_fields=…)``: its changed data that are
    concrete fields of the model (a many-to-many one is saved by ``save_related``), with the
    model's ``auto_now`` fields (``updated_at``); none when nothing changed."""
    concrete = {f.name: f for f in obj._meta.concrete_fields}
    fields = [name for name in form.changed_data if name in concrete]
    if not fields:
        return []
    return [*fields, *(name for name, f in concrete.items() if getattr(f, "auto_now", False) and name not in fields)]


class ChangedFieldsAdmin(admin.ModelAdmin):
    """An edit writes only the columns its form changed. The change view reads the row when the
    edit is posted and saved all of it: a service's write in between (a runner revoked, a token
    revoked by its owner, a server's health check) was put back as it had been read, and a runner
    revoked at that moment came back online with its token valid."""

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:
            super().save_model(request, obj, form, change)
        elif fields := changed_fields(obj, form):
            obj.save(update_fields=fields)


class StrictJSONFormField(forms.JSONField):
    """The admin's JSON fields read as the API reads JSON (``agentops.parser``): NaN, Infinity, a
    NUL or a lone surrogate in a string, 64-bit overflow or deep nesting are refused on the form.
    Django's reading let them through, and the database's JSON check or its json type failed the
    save with a 500 (policy conditions, agent metadata, tool schemas, host labels)."""

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and value.strip() and not self.disabled:
            try:
                json_loads_strict(value)
            except UnsafeJSON as exc:
                raise ValidationError(f"Enter valid JSON: {exc}.", code="invalid") from exc
            except ValueError:
                pass  # not JSON at all: Django's own message
        return super().to_python(value)


def strict_json_everywhere(site: admin.AdminSite) -> None:
    """Every registered ModelAdmin reads its JSON fields with ``StrictJSONFormField`` (called once
    every app's admin is registered: ``AgentopsConfig.ready``, the last app)."""
    for model_admin in site._registry.values():
        overrides = cast(dict[Any, Any], model_admin.formfield_overrides)  # the instance's own dict (its __init__)
        overrides.setdefault(models.JSONField, {"form_class": StrictJSONFormField})


class ReadOnlyAdmin(admin.ModelAdmin):
    """An audit trail: visible, never edited or deleted from the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(ChangedFieldsAdmin):
    """A token is revoked by the action (or ``agentops_token USER --revoke PREFIX``), for good:
    ``revoked_at`` is read-only, so no edit can make a revoked token valid again. Its user is
    read-only too: moved to another user, whoever holds it would act as that user."""

    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "user__username", "name"]
    readonly_fields = ["user", "prefix", "token_sha256", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke_tokens"]

    @admin.action(description="Revoke the selected tokens (for good)", permissions=["change"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = api_tokens_revoke(queryset)
        self.message_user(request, f"{revoked} token(s) revoked; {queryset.count() - revoked} already were.")

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
