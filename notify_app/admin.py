from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from agentops.admin import ReadOnlyAdmin
from agentops.domain import DomainError
from notify_app.models import Delivery, DeliveryAttempt, WebhookEndpoint
from notify_app.services import delivery_replay


class WebhookEndpointForm(forms.ModelForm):
    """The signing secret is write-only, as the vault's values: it was shown in clear on the change
    page, to anyone who could view endpoints."""

    secret = forms.CharField(
        required=False, strip=False, widget=forms.PasswordInput(render_value=False),
        help_text="Write-only: the stored secret is never shown. Leave empty to keep it.")

    class Meta:
        model = WebhookEndpoint
        fields = ["team", "name", "url", "secret", "events", "enabled"]

    def clean_secret(self) -> str:
        given = str(self.cleaned_data.get("secret") or "")
        return given or ("" if self.instance._state.adding else self.instance.secret)


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ["name", "team", "url", "enabled", "created_at"]
    list_filter = ["enabled", "team"]
    fields = ["team", "name", "url", "secret", "events", "enabled"]


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    fields = ("attempt", "ok", "status_code", "error", "duration_ms", "created_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    """The delivery log: every notification, its attempts, and a replay action."""

    list_display = ["created_at", "channel", "event_type", "endpoint", "recipient", "status", "attempts",
                    "next_attempt_at", "last_error"]
    list_filter = ["status", "channel", "event_type"]
    search_fields = ["request_id", "delivery_id"]
    list_select_related = ["endpoint", "recipient"]
    inlines = [DeliveryAttemptInline]
    actions = ["replay"]

    def has_replay_permission(self, request: HttpRequest) -> bool:
        """Sending again needs the change permission on deliveries (the log itself stays read-only)."""
        return request.user.has_perm("notify_app.change_delivery")

    @admin.action(description="Send the selected deliveries again", permissions=["replay"])
    def replay(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        done = 0
        for delivery in queryset:
            try:
                delivery_replay(delivery_pk=delivery.pk)
            except DomainError as exc:
                self.message_user(request, f"{delivery}: {exc.message}", level=messages.ERROR)
            else:
                done += 1
        self.message_user(request, f"Queued {done} deliveries again.")
