from django.apps import AppConfig


class ApprovalsAppConfig(AppConfig):
    name = "approvals_app"
    verbose_name = "Approvals"
    default_auto_field = "django.db.models.BigAutoField"
