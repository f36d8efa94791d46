"""Audit chain heads, and which algorithm made each entry's hash (entries so far: plain SHA-256)."""

import django.db.models.deletion
import django.db.models.manager
from django.db import migrations, models
from django.db.models import Count, Max


def heads_from_existing_chains(apps, schema_editor):
    """Each tenant's head as its chain stands: the entries' count and the newest one's id and hash."""
    Event = apps.get_model("audit", "Event")
    ChainHead = apps.get_model("audit", "ChainHead")
    for row in Event.objects.order_by().values("tenant_id").annotate(count=Count("id"), last_id=Max("id")):
        newest = Event.objects.get(pk=row["last_id"])
        ChainHead.objects.create(tenant_id=row["tenant_id"], count=row["count"], last_id=newest.pk, hash=newest.hash)


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0001_initial'),
        ('tenancy', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='event',
            name='algorithm',
            field=models.CharField(default='sha256', max_length=16),
        ),
        migrations.CreateModel(
            name='ChainHead',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('count', models.PositiveBigIntegerField(default=0)),
                ('last_id', models.BigIntegerField(blank=True, null=True)),
                ('hash', models.CharField(blank=True, default='', max_length=64)),
                ('signature', models.CharField(blank=True, default='', max_length=64)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.tenant')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('tenant',), name='one_audit_head_per_tenant')],
            },
            managers=[
                ('objects', django.db.models.manager.Manager()),
                ('all_tenants', django.db.models.manager.Manager()),
            ],
        ),
        migrations.RunPython(heads_from_existing_chains, migrations.RunPython.noop),
    ]
