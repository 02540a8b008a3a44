from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _seed_builtin_tools(sender: AppConfig, **kwargs: Any) -> None:
    # apps.py is imported before the app registry is ready: models (and services) only from here.
    from tools_app.services import tool_definitions_seed

    tool_definitions_seed()  # creates missing rows only: admin edits survive every migrate


class ToolsAppConfig(AppConfig):
    name = "tools_app"
    verbose_name = "Tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        post_migrate.connect(_seed_builtin_tools, sender=self, dispatch_uid="tools-seed-builtin")
