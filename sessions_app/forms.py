"""Forms of the dashboard: they parse and validate input; the services do the work."""

from typing import Any

from django import forms
from django.db.models import QuerySet

from sessions_app.models import AgentProfile
from sessions_app.services import BUDGET_MAX


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip()]


class SessionStartForm(forms.Form):
    agent = forms.ModelChoiceField(queryset=AgentProfile.objects.none(), to_field_name="slug", empty_label=None)
    title = forms.CharField(max_length=200, required=False)
    input = forms.CharField(widget=forms.Textarea(attrs={"rows": 5, "class": "mono"}), max_length=100_000)
    requirements = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    prohibitions = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    acceptance_criteria = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)

    def __init__(self, *args: Any, agents: "QuerySet[AgentProfile]", **kwargs: Any) -> None:
        """``agents``: the ones the user may start (``selectors.agents_to_start``)."""
        super().__init__(*args, **kwargs)
        self.fields["agent"].queryset = agents  # type: ignore[attr-defined]

    def pinned(self) -> dict[str, Any]:
        return {name: _lines(self.cleaned_data[name]) for name in ("requirements", "prohibitions",
                                                                    "acceptance_criteria")}


class BudgetRaiseForm(forms.Form):
    """New limits for some budgets; a blank field keeps the current one."""

    max_tool_calls = forms.IntegerField(min_value=0, max_value=BUDGET_MAX, required=False, label="Tool calls")
    max_model_calls = forms.IntegerField(min_value=0, max_value=BUDGET_MAX, required=False, label="Model calls")
    max_tokens = forms.IntegerField(min_value=0, max_value=BUDGET_MAX, required=False, label="Tokens")
    max_wall_seconds = forms.IntegerField(min_value=0, max_value=BUDGET_MAX, required=False, label="Wall seconds")

    def budget(self) -> dict[str, int]:
        return {name: value for name, value in self.cleaned_data.items() if value is not None}
class SessionPinnedForm(forms.Form):
    """The pinned context, one item per line."""

    requirements = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    prohibitions = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    acceptance_criteria = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)

    def pinned(self) -> dict[str, Any]:
        return {name: _lines(self.cleaned_data[name]) for name in ("requirements", "prohibitions",
                                                                    "acceptance_criteria")}
