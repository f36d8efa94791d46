"""PostgreSQL: a GIN index on chunk metadata, so a bound metadata filter (`c.metadata @> …`) is
combined with the full-text bitmap (BitmapAnd) instead of being checked row by row. Built with
fastupdate off, like the full-text index. Nothing to do on SQLite."""
from django.db import migrations

CREATE = ("CREATE INDEX IF NOT EXISTS knowledge_chunk_metadata_gin ON knowledge_chunk "
          "USING gin (metadata jsonb_path_ops) WITH (fastupdate = off)")
DROP = "DROP INDEX IF EXISTS knowledge_chunk_metadata_gin"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0002_fulltext")]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
