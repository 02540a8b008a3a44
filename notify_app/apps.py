from django.apps import AppConfig


class NotifyAppConfig(AppConfig):
    """Notifications of the reviewer's workflow: per-team webhooks and email, from an outbox."""

    name = "notify_app"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from approvals_app.signals import approval_changed
        from notify_app.receivers import on_approval_changed

        approval_changed.connect(on_approval_changed, dispatch_uid="notify_app.approval_changed")
