import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agentops", "0003_idempotencyrecord"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Team",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=120)),
                ("slug", models.SlugField(max_length=64, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={"ordering": ["name"]},
        ),
        migrations.CreateModel(
            name="TeamMembership",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("role", models.CharField(choices=[("operator", "Operator"), ("reviewer", "Reviewer"),
                                                   ("both", "Operator and reviewer")],
                                          default="operator", max_length=16)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("team", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="memberships",
                                           to="agentops.team")),
                ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                           related_name="team_memberships", to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "ordering": ["team", "user"],
                "constraints": [
                    models.UniqueConstraint(fields=("team", "user"), name="teammembership_unique"),
                    models.CheckConstraint(condition=models.Q(role__in=["operator", "reviewer", "both"]),
                                           name="teammembership_role_valid"),
                ],
            },
        ),
        migrations.AddField(
            model_name="team",
            name="members",
            field=models.ManyToManyField(related_name="teams", through="agentops.TeamMembership",
                                         to=settings.AUTH_USER_MODEL),
        ),
    ]
