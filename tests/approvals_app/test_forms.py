"""ApprovalEditForm: one field per schema property, typed by the schema, empty means left out."""

from typing import Any

from django.http import QueryDict

from approvals_app.forms import ApprovalEditForm

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "what to run"},
        "cwd": {"type": "string"},
        "timeout_seconds": {"type": "integer"},
        "ratio": {"type": "number"},
        "network": {"type": "boolean"},
        "env": {"type": "object"},
    },
    "required": ["command"],
}


def _post(**fields: str) -> QueryDict:
    data = QueryDict(mutable=True)
    for name, value in fields.items():
        data[f"arg__{name}"] = value
    return data


def test_approval_edit_form_builds_a_field_per_property_with_the_arguments_as_initial() -> None:
    form = ApprovalEditForm(SCHEMA, {"command": "ls\necho two", "timeout_seconds": 30, "network": False,
                                     "extra": [1, 2]})
    assert list(form.fields) == ["arg__command", "arg__cwd", "arg__timeout_seconds", "arg__ratio", "arg__network",
                                 "arg__env", "arg__extra"]  # an argument the schema does not describe too
    html = str(form)
    assert '<textarea name="arg__command"' in html and "ls\necho two</textarea>" in html
    assert '<input type="number" name="arg__timeout_seconds" value="30" step="any"' in html
    assert '<option value="false" selected>false</option>' in html
    assert "[\n  1,\n  2\n]</textarea>" in html  # JSON, pretty-printed
    assert form.fields["arg__command"].schema_required  # type: ignore[attr-defined]
    assert form.fields["arg__command"].help_text == "what to run"
    assert " required" not in html  # the schema decides what is required, on the server


def test_approval_edit_form_types_the_arguments_by_the_schema() -> None:
    form = ApprovalEditForm(SCHEMA, {"command": "ls"},
                            data=_post(command="echo safer\r\necho two", cwd="", timeout_seconds="20", ratio="0.5",
                                       network="true", env='{"A": "1"}'))
    assert form.is_valid(), form.errors
    assert form.edited_arguments() == {"command": "echo safer\necho two", "timeout_seconds": 20, "ratio": 0.5,
                                       "network": True, "env": {"A": "1"}}


def test_approval_edit_form_leaves_out_empty_fields_but_keeps_an_empty_required_text() -> None:
    form = ApprovalEditForm(SCHEMA, {"command": "ls", "cwd": "app"},
                            data=_post(command="", cwd="", timeout_seconds="", network="", env=""))
    assert form.is_valid(), form.errors
    assert form.edited_arguments() == {"command": ""}  # approval_decide refuses it against the schema
    untouched = ApprovalEditForm(SCHEMA, {"command": "ls"}, data=_post(cwd="x"))  # fields not sent at all
    assert untouched.is_valid() and untouched.edited_arguments() == {"cwd": "x"}


def test_approval_edit_form_reports_values_of_the_wrong_type() -> None:
    form = ApprovalEditForm(SCHEMA, {"command": "ls"},
                            data=_post(command="ls", timeout_seconds="soon", network="maybe", env="{not json"))
    assert not form.is_valid()
    lines = form.error_lines()
    assert "timeout_seconds: Enter a whole number." in lines
    assert "env: Enter valid JSON." in lines
    assert any(line.startswith("network: Select a valid choice.") for line in lines)


def test_approval_edit_form_refuses_json_and_numbers_nothing_below_can_hold() -> None:
    """NaN, NUL (PostgreSQL refuses it in jsonb), 64-bit overflow and deep nesting were 500s."""
    for env in ['{"A": NaN}', '{"A": "\\u0000"}', '{"A": 9223372036854775808}', "[" * 100 + "]" * 100]:
        form = ApprovalEditForm(SCHEMA, {"command": "ls"}, data=_post(command="ls", env=env))
        assert not form.is_valid() and "env: Enter valid JSON." in form.error_lines(), env
    for number in ["9223372036854775808", "-9223372036854775809"]:
        form = ApprovalEditForm(SCHEMA, {"command": "ls"}, data=_post(command="ls", timeout_seconds=number))
        assert not form.is_valid(), number
    for ratio in ["nan", "inf"]:
        assert not ApprovalEditForm(SCHEMA, {"command": "ls"}, data=_post(command="ls", ratio=ratio)).is_valid()
