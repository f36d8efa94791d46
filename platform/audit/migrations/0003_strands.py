"""A tenant's audit chain braided of strands: the head each chain had becomes strand 0's, its entries stay
strand 0's, and the other strands' heads are made empty (signed with the audit key when strand 0's head is).
New entries record every strand's count (`seen`).

Stop the servers of the version before this one first: their appends know one head per tenant."""

from django.conf import settings
from django.db import migrations, models
from django.db.models import Q

from audit.chain import head_signature, head_signed_by

STRANDS = 16  # audit.chain.STRANDS when this migration was written


def heads_for_every_strand(apps, schema_editor):
    ChainHead = apps.get_model("audit", "ChainHead")
    key = settings.TOOLKEEPER_AUDIT_KEY.encode()
    for head in ChainHead.objects.filter(strand=0):
        if head.signature and not key:
            raise RuntimeError(
                f"tenant {head.tenant_id}'s audit chain is signed: run this migration with TOOLKEEPER_AUDIT_KEY set, "
                "so that its new strands are signed too (unsigned, its check would report it unsigned from now on)")
        signed = bool(key) and head_signed_by(key, signature=head.signature, tenant_id=head.tenant_id, strand=0,
                                              count=head.count, last_id=head.last_id, hash=head.hash)
        ChainHead.objects.bulk_create([
            ChainHead(tenant_id=head.tenant_id, strand=strand, count=0, last_id=None, hash="",
                      signature=head_signature(key=key, tenant_id=head.tenant_id, strand=strand, count=0,
                                               last_id=None, hash="") if signed else "")
            for strand in range(1, STRANDS)
        ], ignore_conflicts=True)  # a chain that has them already keeps its own


def one_head_per_tenant(apps, schema_editor):
    Event = apps.get_model("audit", "Event")
    if Event.objects.filter(Q(strand__gt=0) | Q(seen__isnull=False)).exists():
        raise RuntimeError("audit entries were appended with strands (their hashes cover their strand's place and "
                           "every strand's count): one chain per tenant cannot hold them without rewriting their "
                           "hashes, which an audit log must not do")
    apps.get_model("audit", "ChainHead").objects.filter(strand__gt=0).delete()


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0002_chain_head'),
        ('tenancy', '0002_tenant_limits'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='chainhead',
            name='one_audit_head_per_tenant',
        ),
        migrations.AddField(
            model_name='chainhead',
            name='strand',
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='event',
            name='strand',
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddConstraint(
            model_name='chainhead',
            constraint=models.UniqueConstraint(fields=('tenant', 'strand'), name='one_audit_head_per_strand'),
        ),
        migrations.AddField(
            model_name='event',
            name='seen',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunPython(heads_for_every_strand, one_head_per_tenant),
    ]
