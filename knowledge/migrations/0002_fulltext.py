"""The full-text index for chunks, for the database in use (knowledge/fts.py explains it): an FTS5
table kept in sync by triggers on SQLite, a generated tsvector column with a GIN index on PostgreSQL.
The SQL is spelled out here so this migration never changes with the application code."""
from django.db import migrations

SQLITE_INSTALL = [
    "CREATE VIRTUAL TABLE IF NOT EXISTS knowledge_chunk_fts USING fts5("
    " title, text, content='knowledge_chunk', content_rowid='id',"
    " tokenize='porter unicode61 remove_diacritics 2')",
    "CREATE TRIGGER IF NOT EXISTS knowledge_chunk_fts_ai AFTER INSERT ON knowledge_chunk BEGIN"
    " INSERT INTO knowledge_chunk_fts(rowid, title, text) VALUES (new.id, new.title, new.text); END",
    "CREATE TRIGGER IF NOT EXISTS knowledge_chunk_fts_ad AFTER DELETE ON knowledge_chunk BEGIN"
    " INSERT INTO knowledge_chunk_fts(knowledge_chunk_fts, rowid, title, text)"
    " VALUES ('delete', old.id, old.title, old.text); END",
    "CREATE TRIGGER IF NOT EXISTS knowledge_chunk_fts_au AFTER UPDATE OF title, text ON knowledge_chunk BEGIN"
    " INSERT INTO knowledge_chunk_fts(knowledge_chunk_fts, rowid, title, text)"
    " VALUES ('delete', old.id, old.title, old.text);"
    " INSERT INTO knowledge_chunk_fts(rowid, title, text) VALUES (new.id, new.title, new.text); END",
    "INSERT INTO knowledge_chunk_fts(knowledge_chunk_fts) VALUES ('rebuild')",
]
SQLITE_UNINSTALL = [
    "DROP TRIGGER IF EXISTS knowledge_chunk_fts_au",
    "DROP TRIGGER IF EXISTS knowledge_chunk_fts_ad",
    "DROP TRIGGER IF EXISTS knowledge_chunk_fts_ai",
    "DROP TABLE IF EXISTS knowledge_chunk_fts",
]

POSTGRES_INSTALL = [
    "ALTER TABLE knowledge_chunk ADD COLUMN search tsvector GENERATED ALWAYS AS ("
    " setweight(to_tsvector('english'::regconfig, coalesce(title, '')), 'A') ||"
    " setweight(to_tsvector('english'::regconfig, coalesce(text, '')), 'B')) STORED",
    "CREATE INDEX knowledge_chunk_search_gin ON knowledge_chunk USING gin (search) WITH (fastupdate = off)",
]
POSTGRES_UNINSTALL = [
    "DROP INDEX IF EXISTS knowledge_chunk_search_gin",
    "ALTER TABLE knowledge_chunk DROP COLUMN IF EXISTS search",
]



def forwards(apps, schema_editor):
    statements = {"sqlite": SQLITE_INSTALL, "postgresql": POSTGRES_INSTALL}.get(schema_editor.connection.vendor, [])
    for statement in statements:
        schema_editor.execute(statement, params=None)


def backwards(apps, schema_editor):
    statements = {"sqlite": SQLITE_UNINSTALL, "postgresql": POSTGRES_UNINSTALL}.get(schema_editor.connection.vendor, [])
    for statement in statements:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0001_initial")]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
