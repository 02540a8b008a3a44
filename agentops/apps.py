from django.apps import AppConfig


class AgentopsConfig(AppConfig):
    name = "agentops"
    verbose_name = "Access"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib import admin

        from agentops import checks  # noqa: F401  (registers the system checks)
        from agentops.admin import strict_json_everywhere
        from agentops.admin_teams import team_scoped_everywhere

        strict_json_everywhere(admin.site)  # agentops is the last app: every admin is registered by now
        team_scoped_everywhere(admin.site)
