"""Each audit entry records the scheme its hash was made with (`Event.version`, audit.chain.HASHED_FIELDS):
the entries already written are scheme 1 (their hashes stay as they are, and verify as before), new ones
scheme 2, which covers every column (the user's id, the strand and the algorithm were outside scheme 1).
The column's database default is 1, so a server of the version before, still running during the upgrade,
writes entries that are what they say.

It goes back only while no entry was hashed with scheme 2: the version before would check such an entry with
scheme 1 and call it changed, and rewriting an audit entry's hash is what the log must never do."""

from django.db import migrations, models


def refuse_while_newer_entries(apps, schema_editor):
    Event = apps.get_model("audit", "Event")
    if Event.objects.filter(version__gt=1).exists():
        raise RuntimeError("audit entries were hashed with scheme 2 (over every column): the version before this "
                           "migration cannot verify them without rewriting their hashes, which an audit log must not "
                           "do")


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0003_strands'),
    ]

    operations = [
        migrations.AddField(
            model_name='event',
            name='version',
            field=models.PositiveSmallIntegerField(db_default=1),
        ),
        migrations.RunPython(migrations.RunPython.noop, refuse_while_newer_entries),
    ]
