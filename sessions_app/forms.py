"""Forms of the dashboard: they parse and validate input; the services do the work."""

from typing import Any

from django import forms

from sessions_app.models import AgentProfile


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip()]


class SessionStartForm(forms.Form):
    agent = forms.ModelChoiceField(queryset=AgentProfile.objects.filter(enabled=True).order_by("name"),
                                   to_field_name="slug", empty_label=None)
    title = forms.CharField(max_length=200, required=False)
    input = forms.CharField(widget=forms.Textarea(attrs={"rows": 5, "class": "mono"}), max_length=100_000)
    requirements = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    prohibitions = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    acceptance_criteria = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)

    def pinned(self) -> dict[str, Any]:
        return {name: _lines(self.cleaned_data[name]) for name in ("requirements", "prohibitions",
                                                                    "acceptance_criteria")}


class SessionPinnedForm(forms.Form):
    """The pinned context, one item per line."""

    requirements = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    prohibitions = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    acceptance_criteria = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)

    def pinned(self) -> dict[str, Any]:
        return {name: _lines(self.cleaned_data[name]) for name in ("requirements", "prohibitions",
                                                                    "acceptance_criteria")}
