"""The dashboard's batch form: paste or upload a JSON list or a CSV (a header row: input, title, …)."""

import csv
import io
import json
from typing import Any

from django import forms

from sessions_app.models import AgentProfile

MAX_UPLOAD_BYTES = 1_000_000


def parse_rows(text: str) -> list[Any]:
    """JSON (a list of objects or of strings) or CSV with an ``input`` column. Raises ValueError."""
    text = text.strip()
    if not text:
        raise ValueError("Paste or upload at least one row.")
    if text[0] in "[{":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"Not valid JSON: {exc}") from exc
        if not isinstance(data, list):
            raise ValueError("The JSON must be a list of rows.")
        return [{"input": row} if isinstance(row, str) else row for row in data]
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or "input" not in reader.fieldnames:
        raise ValueError("A CSV needs a header row with an `input` column (and optionally `title`).")
    return [{k: v for k, v in row.items() if k in ("input", "title") and v} for row in reader]


class BatchStartForm(forms.Form):
    agent = forms.ModelChoiceField(queryset=AgentProfile.objects.none(), to_field_name="slug")
    title = forms.CharField(max_length=200, required=False)
    rows = forms.CharField(widget=forms.Textarea(attrs={"rows": 8}), required=False,
                           help_text='A JSON list ([{"input": "…", "title": "…"}, …]) or CSV with an input column.')
    file = forms.FileField(required=False)

    def __init__(self, *args: Any, agents: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field: Any = self.fields["agent"]
        field.queryset = agents if agents is not None else AgentProfile.objects.none()

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        upload = data.get("file")
        text = data.get("rows") or ""
        if upload is not None:
            if upload.size > MAX_UPLOAD_BYTES:
                raise forms.ValidationError(f"The file is over {MAX_UPLOAD_BYTES} bytes.")
            text = upload.read().decode("utf-8-sig", "replace")  # Excel's "CSV UTF-8" starts with a BOM
        try:
            data["parsed_rows"] = parse_rows(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data
