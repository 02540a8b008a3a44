import contextlib

from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The dashboard renders each event's HTML fragment once, in the process that announces it.
        from sessions_app import announce, fragments

        announce.fragments_renderer = fragments.render_event_fragments
        # The engine listens to approvals_app's `approval_decided` signal (approvals_app must
        # not import the engine: the dependency flows one way).
        with contextlib.suppress(ImportError):
            import sessions_app.engine.receivers  # noqa: F401
