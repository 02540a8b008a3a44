import contextlib

from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The engine listens to approvals_app's `approval_decided` signal (approvals_app must
        # not import the engine: the dependency flows one way).
        with contextlib.suppress(ImportError):
            from sessions_app.engine import receivers  # noqa: F401
