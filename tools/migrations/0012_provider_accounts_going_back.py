from django.db import migrations


def provider_accounts_delete(apps, schema_editor):
    """Going back: the accounts at HTTP tools' providers have no place in the older schema. A migration of its own,
    so that these deletions commit before 0011's tables change (PostgreSQL refuses to alter a table with pending
    trigger events in the same transaction)."""
    apps.get_model("tools", "UpstreamAccount").objects.filter(oauth_provider__isnull=False).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("tools", "0011_oauth_providers"),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, provider_accounts_delete),
    ]
