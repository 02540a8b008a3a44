from django.apps import AppConfig


class AgentopsConfig(AppConfig):
    name = "agentops"
    verbose_name = "Access"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agentops import checks  # noqa: F401  (registers the system checks)
