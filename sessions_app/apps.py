from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The dashboard renders each event's HTML fragment once, in the process that announces it
        # (announce cannot import the templates' module: it sits below the interfaces).
        from sessions_app import announce, fragments

        announce.fragments_renderer = fragments.render_event_fragments
