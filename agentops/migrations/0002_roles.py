"""Create the three roles with their permissions."""

from typing import Any

from django.contrib.auth.management import create_permissions
from django.db import migrations

ROLES: dict[str, list[str]] = {
    "operators": [
        "sessions_app.operate_agentsession", "sessions_app.view_agentsession", "sessions_app.view_agentprofile",
        "sessions_app.view_turn", "sessions_app.view_step", "sessions_app.view_event",
        "sessions_app.view_artifact", "approvals_app.view_approvalrequest", "tools_app.view_tooldefinition",
    ],
    "reviewers": [
        "approvals_app.decide_approvalrequest", "approvals_app.view_approvalrequest",
        "approvals_app.view_approvalgrant", "sessions_app.view_agentsession", "sessions_app.view_turn",
        "sessions_app.view_step", "sessions_app.view_event", "sessions_app.view_artifact",
        "tools_app.view_tooldefinition",
    ],
}
ADMIN_APPS = ("sessions_app", "approvals_app", "tools_app", "agentops", "auth")


def create_roles(apps: Any, schema_editor: Any) -> None:
    # Permissions are normally created after all migrations; the roles need them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for role, codes in ROLES.items():
        group, _ = Group.objects.get_or_create(name=role)
        for code in codes:
            app_label, codename = code.split(".")
            group.permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    admins, _ = Group.objects.get_or_create(name="admins")
    admins.permissions.add(*Permission.objects.filter(content_type__app_label__in=ADMIN_APPS))


def remove_roles(apps: Any, schema_editor: Any) -> None:
    apps.get_model("auth", "Group").objects.filter(name__in=["operators", "reviewers", "admins"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("agentops", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("sessions_app", "0001_initial"),
        ("approvals_app", "0001_initial"),
        ("tools_app", "0001_initial"),
    ]
    operations = [migrations.RunPython(create_roles, remove_roles)]
