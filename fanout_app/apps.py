from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _seed_spawn_tool(sender: AppConfig, **kwargs: Any) -> None:
    from fanout_app.services import spawn_tool_seed

    spawn_tool_seed()


class FanoutAppConfig(AppConfig):
    name = "fanout_app"
    verbose_name = "Subagents and batches"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        post_migrate.connect(_seed_spawn_tool, sender=self, dispatch_uid="fanout-seed-spawn-tool")
        # The engine sits below this app: it learns of the spawn tool and of ended turns through
        # ``sessions_app.hooks`` (a lower layer never imports a higher one).
        from fanout_app import subagents
        from fanout_app.templatetags.fanout_tags import children_fragment
        from sessions_app import hooks

        for event_type in ("subagents.spawned", "subagent.finished"):
            hooks.EVENT_FRAGMENTS[event_type] = children_fragment
        hooks.ENGINE_TOOLS[subagents.SPAWN_TOOL] = hooks.EngineTool(gate=subagents.subagents_spawn,
                                                                     poll=subagents.subagents_collect)
        if subagents.subagent_turn_ended not in hooks.TURN_ENDED:
            hooks.TURN_ENDED.append(subagents.subagent_turn_ended)
