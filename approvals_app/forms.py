"""Forms of the reviewer's pages: they parse and type input; ``approval_decide`` does the rest."""

from typing import Any

from django import forms

from agentops.parser import json_loads_strict
from sessions_app.presenters import pretty_json

LONG_TEXT_FIELDS = ("command", "content", "body", "text")
FIELD_PREFIX = "arg__"
BOOL_CHOICES = [("", "(not set)"), ("true", "true"), ("false", "false")]


def _kind(name: str, spec: dict[str, Any], value: Any) -> str:
    kind = spec.get("type")
    if kind == "string":
        long = name in LONG_TEXT_FIELDS or int(spec.get("maxLength") or 0) > 500
        return "textarea" if long or (isinstance(value, str) and "\n" in value) else "text"
    if kind == "integer":
        return "integer"
    if kind == "number":
        return "number"
    if kind == "boolean":
        return "bool"
    return "json"  # objects, arrays, and arguments the schema does not describe


def _initial(kind: str, value: Any) -> Any:
    if value is None:
        return ""
    if kind == "bool":
        return "true" if value else "false"
    if kind == "json":
        return pretty_json(value)
    return value


def _field(kind: str) -> forms.Field:
    # Every field is optional here: an empty one leaves the argument out, and the tool's schema
    # (checked again by approval_decide) says what is required.
    if kind == "integer":
        return forms.IntegerField(required=False, min_value=-(2**63), max_value=2**63 - 1,
                                  widget=forms.NumberInput(attrs={"step": "any"}))
    if kind == "number":
        return forms.FloatField(required=False, widget=forms.NumberInput(attrs={"step": "any"}))
    if kind == "bool":
        return forms.ChoiceField(required=False, choices=BOOL_CHOICES)
    if kind == "text":
        return forms.CharField(required=False, strip=False, widget=forms.TextInput(attrs={"class": "mono"}))
    rows = 4 if kind == "json" else 3
    return forms.CharField(required=False, strip=False, widget=forms.Textarea(attrs={"rows": rows, "class": "mono"}))


class ApprovalEditForm(forms.Form):
    """Edit a tool call's arguments, one field per property of the tool's JSON schema (and per
    argument the schema does not describe, edited as JSON). Fields are named ``arg__<name>``.

    ``edited_arguments()`` gives the arguments typed by the schema; ``approval_decide`` validates
    them against the schema again.
    """

    use_required_attribute = False

    def __init__(self, schema: dict[str, Any], arguments: dict[str, Any], data: Any = None) -> None:
        super().__init__(data=data)
        properties: dict[str, Any] = dict(schema.get("properties") or {})
        for name in arguments:
            properties.setdefault(name, {})
        required = set(schema.get("required") or [])
        self.kinds: dict[str, str] = {}
        for name, spec in properties.items():
            spec = spec if isinstance(spec, dict) else {}
            kind = _kind(name, spec, arguments.get(name))
            field = _field(kind)
            field.label = name
            field.help_text = str(spec.get("description", ""))[:200]
            field.initial = _initial(kind, arguments.get(name))
            field.schema_required = name in required  # type: ignore[attr-defined]  # shown as a hint
            self.fields[FIELD_PREFIX + name] = field
            self.kinds[name] = kind

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for name, kind in self.kinds.items():
            key = FIELD_PREFIX + name
            value = cleaned.get(key)
            if kind in ("text", "textarea") and isinstance(value, str):
                cleaned[key] = value.replace("\r\n", "\n")  # browsers send textarea lines with CRLF
            elif kind == "json" and isinstance(value, str) and value != "":
                try:  # strict: NaN, NUL, 64-bit overflow and deep nesting were 500s further down
                    cleaned[key] = json_loads_strict(value)
                except ValueError:
                    self.add_error(key, "Enter valid JSON.")
        return cleaned

    def edited_arguments(self) -> dict[str, Any]:
        """The arguments as edited (call after ``is_valid()``). A field left empty leaves its
        argument out, except a required text field that was sent empty: that stays ``""``."""
        arguments: dict[str, Any] = {}
        for name, kind in self.kinds.items():
            key = FIELD_PREFIX + name
            if key not in self.data:
                continue
            value = self.cleaned_data.get(key)
            if kind in ("text", "textarea"):
                if value == "" and not self.fields[key].schema_required:  # type: ignore[attr-defined]
                    continue
            elif kind == "json":
                if self.data[key] == "":
                    continue  # (JSON null is a value)
            elif value is None or value == "":
                continue
            arguments[name] = (value == "true") if kind == "bool" else value
        return arguments

    def error_lines(self) -> list[str]:
        return [f"{key.removeprefix(FIELD_PREFIX)}: {message}" for key, messages in self.errors.items()
                for message in messages]
