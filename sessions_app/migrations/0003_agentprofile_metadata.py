from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("sessions_app", "0002_drop_redundant_fk_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentprofile",
            name="metadata",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
