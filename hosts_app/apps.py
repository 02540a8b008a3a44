from django.apps import AppConfig


class HostsAppConfig(AppConfig):
    name = "hosts_app"
    verbose_name = "Sandbox hosts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The hooks the engine asks (which queue, which host may open a workspace) and the hosted
        # worker's registration + heartbeat thread: hosts_app sits above sessions_app, so the
        # lower layers reach it only through these registrations.
        from hosts_app import hooks, worker

        hooks.install()
        worker.connect_signals()
