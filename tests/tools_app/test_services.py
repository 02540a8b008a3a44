import logging
from collections.abc import Callable
from functools import partial

import pytest
from django.db import IntegrityError, transaction

from agentops.domain import InvalidTransition
from tests.concurrency import run_together
from tools_app.builtin import BUILTIN_TOOLS, ToolResult, execute_tool
from tools_app.models import Outbox, ToolDefinition
from tools_app.outbox import outbox_deliver, outbox_send
from tools_app.sandbox import workspace_for
from tools_app.selectors import tool_definition_get, tool_definitions_enabled
from tools_app.services import tool_definitions_seed


@pytest.mark.django_db
def test_tool_definitions_seed_creates_missing_and_keeps_admin_edits() -> None:
    tool_definitions_seed()
    # Besides the built-ins: spawn_subagents, seeded by fanout_app (the engine runs it itself).
    assert set(ToolDefinition.objects.values_list("name", flat=True)) - {"spawn_subagents"} == set(BUILTIN_TOOLS)
    run_command = tool_definition_get("run_command")
    assert run_command is not None and run_command.approval_mode == "mutating"
    assert run_command.parameters_schema == BUILTIN_TOOLS["run_command"].parameters_schema
    run_command.full_clean()  # the seeded schema passes the model's own validator
    ToolDefinition.objects.filter(name="run_command").update(approval_mode="confirm_once", timeout_seconds=7)
    ToolDefinition.objects.filter(name="send_email").update(enabled=False)
    ToolDefinition.objects.filter(name="list_files").delete()
    tool_definitions_seed()
    run_command = tool_definition_get("run_command")
    assert run_command is not None and (run_command.approval_mode, run_command.timeout_seconds) == ("confirm_once", 7)
    assert tool_definition_get("list_files") is not None
    assert tool_definition_get("nope") is None
    assert "send_email" not in {definition.name for definition in tool_definitions_enabled()}


@pytest.mark.django_db
def test_outbox_send_is_idempotent_by_key() -> None:
    first, created = outbox_send(idempotency_key="k1", to="a@example.com", subject="s", body="b")
    again, created_again = outbox_send(idempotency_key="k1", to="other@example.com", subject="x", body="y")
    assert created and not created_again and again.pk == first.pk
    assert again.to == "a@example.com" and again.status == Outbox.Status.SENT and again.sent_at is not None
    assert outbox_deliver(outbox_id=first.pk) is False  # a second delivery sends nothing
    assert Outbox.objects.count() == 1


@pytest.fixture
def deliveries(caplog: pytest.LogCaptureFixture) -> Callable[[], int]:
    """How many emails went out: the development delivery's one effect is its log line."""
    caplog.set_level(logging.INFO, logger="tools_app.outbox")
    return lambda: sum(1 for record in caplog.records
                       if record.name == "tools_app.outbox" and "delivered" in record.getMessage())


EMAIL = {"to": "ops@example.com", "subject": "Report", "body": "Done."}


@pytest.mark.django_db
def test_send_email_twice_with_the_same_key_sends_once(deliveries: Callable[[], int]) -> None:
    workspace = workspace_for("outbox-session")
    first = execute_tool(name="send_email", workspace=workspace, arguments=EMAIL, idempotency_key="step-1")
    second = execute_tool(name="send_email", workspace=workspace, arguments=EMAIL, idempotency_key="step-1")
    assert first.status == second.status == "completed"
    assert first.data["outbox_id"] == second.data["outbox_id"] and second.data["duplicate"] is True
    assert Outbox.objects.count() == 1 and Outbox.objects.get().status == "sent"
    assert deliveries() == 1
    no_key = execute_tool(name="send_email", workspace=workspace, arguments=EMAIL)
    assert no_key.error_code == "invalid_arguments"
    bad = execute_tool(name="send_email", workspace=workspace, arguments={**EMAIL, "to": "a@b.c, d@e.f"},
                       idempotency_key="step-2")
    assert bad.error_code == "invalid_arguments" and Outbox.objects.count() == 1
    assert deliveries() == 1


@pytest.mark.django_db(transaction=True)
def test_send_email_racing_with_the_same_key_sends_once(deliveries: Callable[[], int]) -> None:
    """A redelivered task runs the tool again while the first run is still inside it."""
    workspace = workspace_for("outbox-race")
    for attempt in range(5):  # each round is one race; five make losing the race on INSERT near certain
        key = f"step-race-{attempt}"
        results = run_together([partial(execute_tool, name="send_email", workspace=workspace, arguments=EMAIL,
                                         idempotency_key=key) for _ in range(4)])
        assert all(isinstance(result, ToolResult) and result.status == "completed" for result in results), results
        assert len({result.data["outbox_id"] for result in results}) == 1
        assert sorted(result.data["duplicate"] for result in results) == [False, True, True, True]
        assert deliveries() == attempt + 1
    assert Outbox.objects.count() == 5
    assert set(Outbox.objects.values_list("status", flat=True)) == {"sent"}


def test_outbox_transitions_allow_only_pending_to_sent() -> None:
    assert set(Outbox.TRANSITIONS) == set(Outbox.Status.values)
    assert Outbox(status=Outbox.Status.PENDING).can_move_to(Outbox.Status.SENT)
    assert not Outbox(status=Outbox.Status.SENT).can_move_to(Outbox.Status.PENDING)


@pytest.mark.django_db
def test_outbox_deliver_checks_the_transition_table_before_it_claims(monkeypatch: pytest.MonkeyPatch,
                                                                     deliveries: Callable[[], int]) -> None:
    outbox = Outbox.objects.create(idempotency_key="k-table", to="a@example.com", subject="s", body="b")
    monkeypatch.setattr(Outbox, "TRANSITIONS", {Outbox.Status.PENDING: frozenset(), Outbox.Status.SENT: frozenset()})
    with pytest.raises(InvalidTransition):
        outbox_deliver(outbox_id=outbox.pk)
    outbox.refresh_from_db()
    assert outbox.status == Outbox.Status.PENDING and outbox.sent_at is None and deliveries() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(("model", "field"), [(Outbox, "status"), (ToolDefinition, "kind"),
                                              (ToolDefinition, "approval_mode"), (ToolDefinition, "network")])
def test_check_constraints_reject_unknown_choices(model: type[Outbox | ToolDefinition], field: str) -> None:
    tool_definitions_seed()
    outbox_send(idempotency_key="k-constraint", to="a@example.com", subject="s", body="b")
    assert model.objects.exists()
    with pytest.raises(IntegrityError), transaction.atomic():
        model.objects.update(**{field: "bogus"})
