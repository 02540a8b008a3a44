"""Runners' jobs are signed with Ed25519 keys derived from the server's secret: the plaintext
HMAC signing keys go (whoever read them could sign jobs); the public key is kept instead. Runners
created before have none and are refused until they get a new token (POST /api/runners/<name>/token)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("hosts_app", "0001_initial"),
    ]

    operations = [
        migrations.RemoveField(model_name="sandboxhost", name="signing_key"),
        migrations.AddField(model_name="sandboxhost", name="public_key",
                            field=models.CharField(blank=True, max_length=64)),
    ]
