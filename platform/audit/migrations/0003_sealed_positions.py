"""Entries are sealed into their chain after they commit: each gets a position in its tenant's chain.

The entries so far were chained in id order as they were written: their positions follow their ids.
Going back leaves the positions off; entries sealed since this migration were chained in position order,
which can differ from id order where writes overlapped, and the earlier code walks chains by id.
"""
from django.conf import settings
from django.db import migrations, models


def positions_from_ids(apps, schema_editor):
    table = schema_editor.quote_name(apps.get_model("audit", "Event")._meta.db_table)
    schema_editor.execute(
        f"UPDATE {table} SET position = numbered.n FROM (SELECT id, ROW_NUMBER() OVER "  # noqa: S608 (a model's table)
        f"(PARTITION BY tenant_id ORDER BY id) AS n FROM {table}) AS numbered WHERE {table}.id = numbered.id"
    )


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0002_chain_head'),
        ('tenancy', '0002_tenant_limits'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='event',
            name='position',
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(positions_from_ids, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name='event',
            index=models.Index(condition=models.Q(('position__isnull', True)), fields=['tenant', 'id'], name='audit_unsealed'),
        ),
        migrations.AddConstraint(
            model_name='event',
            constraint=models.UniqueConstraint(fields=('tenant', 'position'), name='one_audit_entry_per_position'),
        ),
    ]
