from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Where each event's HTML fragment is rendered once: in each web process that forwards it
        # (AGENTOPS_RENDER_IN_WEB, the default: measured, rendering in the busy writer was the largest
        # share of the push latency), else in the process that announces it (announce cannot import
        # the templates' module: it sits below the interfaces).
        from django.conf import settings

        from sessions_app import announce, fragments

        announce.fragments_web_renderer = fragments.render_event_fragments
        if not settings.AGENTOPS_RENDER_IN_WEB:
            announce.fragments_renderer = fragments.render_event_fragments
