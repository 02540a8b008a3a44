"""The admin's edits of rows the services also write (agentops.admin.ChangedFieldsAdmin): only the
columns the form changed are saved, so a service's write while the edit is posted stays."""

from django.contrib.auth.models import User
from django.utils import timezone

from agentops.models import ApiToken
from agentops.services import api_token_create
from hosts_app import runners
from hosts_app.models import SandboxHost
from tests import factories
from tests.helpers import admin_edit


def test_a_runner_revoked_while_an_admin_edit_is_posted_stays_revoked(operator: User) -> None:
    runner, token = runners.runner_create(team=factories.team(), name="cust", actor=operator)
    boss = factories.user("boss", is_staff=True, is_superuser=True)
    read = SandboxHost.objects.get(pk=runner.pk)  # the change view reads the row for the posted edit
    runners.runner_revoke(name="cust", actor=operator)  # meanwhile
    revoked = SandboxHost.objects.get(pk=runner.pk)

    admin_edit(read, boss, capacity=7)

    row = SandboxHost.objects.get(pk=runner.pk)
    assert (row.capacity, row.status) == (7, SandboxHost.Status.REVOKED)  # a whole-row save: "online" again
    assert row.revoked_at == revoked.revoked_at and row.updated_at > revoked.updated_at  # the edit's time
    assert runners.runner_authenticate(token) is None


def test_a_token_used_while_an_admin_renames_it_keeps_its_last_use(operator: User) -> None:
    row, _ = api_token_create(username=operator.username, name="ci")
    boss = factories.user("boss", is_staff=True, is_superuser=True)
    read = ApiToken.objects.get(pk=row.pk)
    used = timezone.now()
    ApiToken.objects.filter(pk=row.pk).update(last_used_at=used)  # a request authenticated with it meanwhile

    admin_edit(read, boss, name="ci-nightly")

    after = ApiToken.objects.get(pk=row.pk)
    assert (after.name, after.last_used_at) == ("ci-nightly", used)


def test_an_admin_edit_that_changes_nothing_writes_nothing(operator: User) -> None:
    runner, _ = runners.runner_create(team=factories.team(), name="cust", actor=operator)
    boss = factories.user("boss", is_staff=True, is_superuser=True)
    read = SandboxHost.objects.get(pk=runner.pk)
    runners.runner_revoke(name="cust", actor=operator)

    admin_edit(read, boss)

    assert SandboxHost.objects.get(pk=runner.pk).status == SandboxHost.Status.REVOKED
