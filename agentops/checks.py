"""System checks: every state machine's TRANSITIONS table covers every status of its field."""

from typing import Any

from django.apps import apps
from django.core import checks

from agentops.domain import StateMachine


@checks.register()
def state_machines_complete(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for model in apps.get_models():
        if not issubclass(model, StateMachine):
            continue
        field = model._meta.get_field("status")
        statuses = {str(value) for value, _ in getattr(field, "choices", None) or ()}
        keys = {str(key) for key in model.TRANSITIONS}
        targets = {str(to) for tos in model.TRANSITIONS.values() for to in tos}
        if statuses != keys or not targets <= statuses:
            errors.append(checks.Error(
                f"{model.__name__}.TRANSITIONS must have one key per status and name only statuses",
                hint=f"missing keys: {sorted(statuses - keys)}; unknown: {sorted((keys | targets) - statuses)}",
                obj=model, id="agentops.E001"))
    return errors
