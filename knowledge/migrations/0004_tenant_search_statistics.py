"""Search statistics per tenant (knowledge/fts.py explains why: another tenant's corpus must not change a
tenant's ranking). SQLite: one FTS5 table per tenant instead of one for all, since bm25() takes its
statistics from the whole table. PostgreSQL: `knowledge_lexeme`, how many of each tenant's chunks hold
each lexeme, kept by statement triggers on the chunk table, which candidate selection reads instead of
the planner's table-wide statistics. Reversed, the shared FTS5 table comes back and is rebuilt, or the
lexeme counts go. The SQL is spelled out here so this migration never changes with the application code."""
from django.db import migrations

SHARED_INSTALL = [
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
SHARED_UNINSTALL = [
    "DROP TRIGGER IF EXISTS knowledge_chunk_fts_au",
    "DROP TRIGGER IF EXISTS knowledge_chunk_fts_ad",
    "DROP TRIGGER IF EXISTS knowledge_chunk_fts_ai",
    "DROP TABLE IF EXISTS knowledge_chunk_fts",
]
TENANT_INSTALL = [
    "CREATE VIRTUAL TABLE IF NOT EXISTS knowledge_fts_t{n} USING fts5("
    " title, text, content='knowledge_chunk', content_rowid='id',"
    " tokenize='porter unicode61 remove_diacritics 2')",
    "CREATE TRIGGER IF NOT EXISTS knowledge_fts_t{n}_ai AFTER INSERT ON knowledge_chunk WHEN new.tenant_id = {n}"
    " BEGIN INSERT INTO knowledge_fts_t{n}(rowid, title, text) VALUES (new.id, new.title, new.text); END",
    "CREATE TRIGGER IF NOT EXISTS knowledge_fts_t{n}_ad AFTER DELETE ON knowledge_chunk WHEN old.tenant_id = {n}"
    " BEGIN INSERT INTO knowledge_fts_t{n}(knowledge_fts_t{n}, rowid, title, text)"
    " VALUES ('delete', old.id, old.title, old.text); END",
    "CREATE TRIGGER IF NOT EXISTS knowledge_fts_t{n}_au AFTER UPDATE OF title, text ON knowledge_chunk"
    " WHEN old.tenant_id = {n} BEGIN"
    " INSERT INTO knowledge_fts_t{n}(knowledge_fts_t{n}, rowid, title, text)"
    " VALUES ('delete', old.id, old.title, old.text);"
    " INSERT INTO knowledge_fts_t{n}(rowid, title, text) VALUES (new.id, new.title, new.text); END",
    "INSERT INTO knowledge_fts_t{n}(rowid, title, text) SELECT id, title, text FROM knowledge_chunk"
    " WHERE tenant_id = {n}",
]
TENANT_UNINSTALL = [
    "DROP TRIGGER IF EXISTS knowledge_fts_t{n}_au",
    "DROP TRIGGER IF EXISTS knowledge_fts_t{n}_ad",
    "DROP TRIGGER IF EXISTS knowledge_fts_t{n}_ai",
    "DROP TABLE IF EXISTS knowledge_fts_t{n}",
]


POSTGRES_INSTALL = [
    "CREATE TABLE knowledge_lexeme (tenant_id integer NOT NULL, lexeme text NOT NULL, chunks integer NOT NULL,"
    " PRIMARY KEY (tenant_id, lexeme))",
    # Rows are locked in key order, so concurrent writers of one tenant's chunks cannot deadlock here.
    """CREATE FUNCTION knowledge_lexeme_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO knowledge_lexeme AS k (tenant_id, lexeme, chunks)
        SELECT n.tenant_id, l.lexeme, count(*) FROM new_chunks n, unnest(tsvector_to_array(n.search)) AS l(lexeme)
        GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (tenant_id, lexeme) DO UPDATE SET chunks = k.chunks + excluded.chunks;
        RETURN NULL;
    END $$""",
    """CREATE FUNCTION knowledge_lexeme_remove() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM 1 FROM knowledge_lexeme k WHERE (k.tenant_id, k.lexeme) IN (
            SELECT o.tenant_id, l.lexeme FROM old_chunks o, unnest(tsvector_to_array(o.search)) AS l(lexeme))
        ORDER BY k.tenant_id, k.lexeme FOR UPDATE;
        UPDATE knowledge_lexeme k SET chunks = k.chunks - g.n FROM (
            SELECT o.tenant_id, l.lexeme, count(*) AS n FROM old_chunks o, unnest(tsvector_to_array(o.search)) AS l(lexeme)
            GROUP BY 1, 2) g
        WHERE k.tenant_id = g.tenant_id AND k.lexeme = g.lexeme;
        RETURN NULL;
    END $$""",
    """CREATE FUNCTION knowledge_lexeme_clear() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        TRUNCATE knowledge_lexeme;
        RETURN NULL;
    END $$""",
    "CREATE TRIGGER knowledge_lexeme_ai AFTER INSERT ON knowledge_chunk REFERENCING NEW TABLE AS new_chunks"
    " FOR EACH STATEMENT EXECUTE FUNCTION knowledge_lexeme_add()",
    "CREATE TRIGGER knowledge_lexeme_ad AFTER DELETE ON knowledge_chunk REFERENCING OLD TABLE AS old_chunks"
    " FOR EACH STATEMENT EXECUTE FUNCTION knowledge_lexeme_remove()",
    # An update counts as a delete of the old rows and an insert of the new ones.
    "CREATE TRIGGER knowledge_lexeme_au_old AFTER UPDATE ON knowledge_chunk REFERENCING OLD TABLE AS old_chunks"
    " FOR EACH STATEMENT EXECUTE FUNCTION knowledge_lexeme_remove()",
    "CREATE TRIGGER knowledge_lexeme_au_new AFTER UPDATE ON knowledge_chunk REFERENCING NEW TABLE AS new_chunks"
    " FOR EACH STATEMENT EXECUTE FUNCTION knowledge_lexeme_add()",
    "CREATE TRIGGER knowledge_lexeme_at AFTER TRUNCATE ON knowledge_chunk"
    " FOR EACH STATEMENT EXECUTE FUNCTION knowledge_lexeme_clear()",
    "INSERT INTO knowledge_lexeme (tenant_id, lexeme, chunks)"
    " SELECT c.tenant_id, l.lexeme, count(*) FROM knowledge_chunk c, unnest(tsvector_to_array(c.search)) AS l(lexeme)"
    " GROUP BY 1, 2",
]
POSTGRES_UNINSTALL = [
    "DROP TRIGGER IF EXISTS knowledge_lexeme_at ON knowledge_chunk",
    "DROP TRIGGER IF EXISTS knowledge_lexeme_au_new ON knowledge_chunk",
    "DROP TRIGGER IF EXISTS knowledge_lexeme_au_old ON knowledge_chunk",
    "DROP TRIGGER IF EXISTS knowledge_lexeme_ad ON knowledge_chunk",
    "DROP TRIGGER IF EXISTS knowledge_lexeme_ai ON knowledge_chunk",
    "DROP FUNCTION IF EXISTS knowledge_lexeme_clear()",
    "DROP FUNCTION IF EXISTS knowledge_lexeme_remove()",
    "DROP FUNCTION IF EXISTS knowledge_lexeme_add()",
    "DROP TABLE IF EXISTS knowledge_lexeme",
]


def _rows(schema_editor, sql: str) -> list:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in POSTGRES_INSTALL:
            schema_editor.execute(statement, params=None)
    if schema_editor.connection.vendor != "sqlite":
        return
    for statement in SHARED_UNINSTALL:
        schema_editor.execute(statement, params=None)
    tenants = _rows(schema_editor, "SELECT id FROM tenancy_tenant UNION SELECT DISTINCT tenant_id FROM knowledge_chunk")
    for (tenant_id,) in sorted(tenants):
        for statement in TENANT_INSTALL:
            schema_editor.execute(statement.format(n=int(tenant_id)), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in POSTGRES_UNINSTALL:
            schema_editor.execute(statement, params=None)
    if schema_editor.connection.vendor != "sqlite":
        return
    tables = _rows(schema_editor, "SELECT name FROM sqlite_master WHERE type = 'table'"
                                  " AND sql LIKE 'CREATE VIRTUAL TABLE%' AND name GLOB 'knowledge_fts_t[0-9]*'")
    for (name,) in tables:
        for statement in TENANT_UNINSTALL:
            schema_editor.execute(statement.format(n=int(name[len("knowledge_fts_t"):])), params=None)
    for statement in SHARED_INSTALL:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0003_metadata_gin"), ("tenancy", "0001_initial")]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
