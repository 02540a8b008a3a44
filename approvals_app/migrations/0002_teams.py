from typing import Any

import django.db.models.deletion
from django.db import migrations, models


def copy_team(apps: Any, schema_editor: Any) -> None:
    ApprovalRequest = apps.get_model("approvals_app", "ApprovalRequest")
    for approval in ApprovalRequest.objects.select_related("session").filter(team__isnull=True):
        approval.team_id = approval.session.team_id
        approval.save(update_fields=["team"])


class Migration(migrations.Migration):
    dependencies = [
        ("approvals_app", "0001_initial"),
        ("sessions_app", "0003_teams"),
    ]

    operations = [
        migrations.AddField(
            model_name="approvalrequest", name="team",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name="+",
                                    to="agentops.team"),
        ),
        migrations.RunPython(copy_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="approvalrequest", name="team",
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+",
                                    to="agentops.team"),
        ),
    ]
