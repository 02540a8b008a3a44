from django.apps import AppConfig


class ToolsAppConfig(AppConfig):
    name = "tools_app"
    verbose_name = "Tools"
    default_auto_field = "django.db.models.BigAutoField"
