from django.apps import AppConfig


class VaultAppConfig(AppConfig):
    name = "vault_app"
    verbose_name = "Secrets vault"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from vault_app import checks, crypto

        # Every process (web, worker, gateway, manage.py) refuses to start with a missing or
        # malformed key: a worker that cannot decrypt would fail every call that uses a secret.
        crypto.vault_keys()
        checks.register()
        from mcp_app.secret_refs import secret_resolver_set
        from vault_app.resolve import text_resolve

        # MCP servers' headers and env resolve {{secret:NAME}} through the vault (executing task only).
        secret_resolver_set(text_resolve)
