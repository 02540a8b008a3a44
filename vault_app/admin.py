"""The vault in the Django admin: the value is a write-only field (never rendered back); saving
goes through the services, which encrypt it."""

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from agentops.domain import DomainError
from vault_app import services
from vault_app.models import Secret


class SecretForm(forms.ModelForm):
    value = forms.CharField(
        required=False, strip=False, widget=forms.PasswordInput(render_value=False),
        help_text="Write-only: the stored value is never shown. Leave empty to keep it (required on create).")

    class Meta:
        model = Secret
        fields = ["team", "name", "description", "allowed_tools", "expires_at"]

    def clean(self) -> dict[str, Any]:
        """The services' own checks, here: a refusal raised in save_model came after the admin had
        decided the save worked ("added successfully", a link to a secret that does not exist)."""
        data = super().clean() or {}
        adding = self.instance._state.adding
        if adding and not data.get("value"):
            self.add_error("value", "A new secret needs a value.")
        tools = data.get("allowed_tools")
        if tools is not None and not isinstance(tools, list):
            self.add_error("allowed_tools", "A JSON list of tool names or glob patterns.")
            tools = None
        checks: list[tuple[str, Callable[[], None]]] = [
            ("name", lambda: services.secret_fields_check(name=data.get("name") if adding else None, value=None,
                                                          allowed_tools=None)),
            ("value", lambda: services.secret_fields_check(name=None, value=data.get("value"), allowed_tools=None)),
            ("allowed_tools", lambda: services.secret_fields_check(name=None, value=None, allowed_tools=tools)),
        ]
        for field, check in checks:
            try:
                check()
            except DomainError as exc:
                self.add_error(field, exc.message)
        return data


@admin.register(Secret)
class SecretAdmin(admin.ModelAdmin):
    form = SecretForm
    list_display = ["name", "team", "allowed_tools", "expires_at", "value_updated_at", "created_by"]
    list_filter = ["team"]
    search_fields = ["name", "description"]
    readonly_fields = ["value_updated_at", "created_by", "created_at", "updated_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Secret]:
        return super().get_queryset(request).defer("ciphertext")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*self.readonly_fields, "team", "name"] if obj is not None else list(self.readonly_fields)

    def save_model(self, request: HttpRequest, obj: Secret, form: Any, change: bool) -> None:
        data = form.cleaned_data
        try:
            if change:
                saved = services.secret_update(
                    actor=request.user, secret_id=obj.pk, value=data.get("value") or None,
                    allowed_tools=data.get("allowed_tools") or [], description=data.get("description", ""),
                    expires_at=data.get("expires_at"), clear_expiry=data.get("expires_at") is None)
            else:
                saved = services.secret_create(
                    actor=request.user, team_id=data["team"].pk, name=data["name"], value=data["value"],
                    allowed_tools=data.get("allowed_tools") or [], description=data.get("description", ""),
                    expires_at=data.get("expires_at"))
        except DomainError as exc:
            self.message_user(request, exc.message, level=messages.ERROR)
            return
        obj.pk, obj._state.adding = saved.pk, False

    def delete_model(self, request: HttpRequest, obj: Secret) -> None:
        services.secret_delete(actor=request.user, secret_id=obj.pk)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Secret]) -> None:
        for secret in queryset:
            services.secret_delete(actor=request.user, secret_id=secret.pk)
