"""The full-text index behind `Chunk`, per database vendor.

SQLite: one external-content FTS5 table per tenant, `knowledge_fts_t<tenant id>(title, text)` (Porter
stemming), kept in sync with that tenant's rows of `knowledge_chunk` by triggers, ranked with bm25()
(title weighted 3:1), snippets from snippet(). A table per tenant because bm25() takes its statistics
(row count, average length, rows per term) from the whole FTS table: in a shared one, another tenant's
corpus would change a tenant's scores. Created with the tenant (and, for safety, before a tenant's
first chunks are written: `sqlite_tenant_index`). Never 'rebuild' such a table: its
content table holds every tenant's chunks.

PostgreSQL: a generated, stored `tsvector` column `knowledge_chunk.search` (title weight A,
text weight B, the `english` configuration) with a GIN index, ranked with ts_rank_cd() (which depends on
the row alone), snippets from ts_headline(); a second GIN index on `metadata` (migration 0003) serves
bound filters. `knowledge_lexeme(tenant_id, lexeme, chunks)` counts the tenant's chunks holding each
lexeme, kept by statement triggers on the chunk table (migration 0004): candidate selection reads it
instead of counting on the GIN index (whose bitmaps cost in proportion to the whole table's postings) or
the planner's table-wide statistics. Both GIN indexes are built with fastupdate off: a pending list left
by a bulk ingest makes the planner shun the index and scans slow (50 ms instead of 1 ms at 10,000
chunks); it costs ingest speed instead.

Caution for later migrations: on SQLite, Django rebuilds a table to alter it, which drops its
triggers. A migration that alters `knowledge_chunk` must call `sqlite_install(schema_editor)`
again afterwards (it is idempotent and re-indexes every tenant's chunks). On PostgreSQL, `title` and
`text` cannot change type while the generated column uses them.
"""
from common.fulltext import MAX_TERMS, STOP_WORDS, postgres_tsquery, query_terms, sqlite_match

__all__ = ["MAX_TERMS", "STOP_WORDS", "postgres_tsquery", "query_terms", "sqlite_match"]

_SQLITE_TOKENIZE = "porter unicode61 remove_diacritics 2"


def sqlite_table(tenant_id: int) -> str:
    return f"knowledge_fts_t{int(tenant_id)}"


def _sqlite_tenant_install(tenant_id: int) -> list[str]:
    # Interpolated: the table name and the WHEN clause carry the tenant id, an int.
    table, n = sqlite_table(tenant_id), int(tenant_id)
    return [
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING fts5("
        f" title, text, content='knowledge_chunk', content_rowid='id', tokenize='{_SQLITE_TOKENIZE}')",
        f"CREATE TRIGGER IF NOT EXISTS {table}_ai AFTER INSERT ON knowledge_chunk WHEN new.tenant_id = {n} BEGIN"  # noqa: S608
        f" INSERT INTO {table}(rowid, title, text) VALUES (new.id, new.title, new.text); END",
        f"CREATE TRIGGER IF NOT EXISTS {table}_ad AFTER DELETE ON knowledge_chunk WHEN old.tenant_id = {n} BEGIN"  # noqa: S608
        f" INSERT INTO {table}({table}, rowid, title, text) VALUES ('delete', old.id, old.title, old.text); END",
        f"CREATE TRIGGER IF NOT EXISTS {table}_au AFTER UPDATE OF title, text ON knowledge_chunk"  # noqa: S608
        f" WHEN old.tenant_id = {n} BEGIN"
        f" INSERT INTO {table}({table}, rowid, title, text) VALUES ('delete', old.id, old.title, old.text);"
        f" INSERT INTO {table}(rowid, title, text) VALUES (new.id, new.title, new.text); END",
    ]


def sqlite_table_exists(cursor, tenant_id: int) -> bool:
    cursor.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = %s", [sqlite_table(tenant_id)])
    return cursor.fetchone() is not None


def sqlite_tenant_index(cursor, tenant_id: int) -> None:
    """Create the tenant's FTS5 table and triggers and index its chunks, unless the table exists."""
    if sqlite_table_exists(cursor, tenant_id):
        return
    for statement in _sqlite_tenant_install(tenant_id):
        cursor.execute(statement)
    cursor.execute(f"INSERT INTO {sqlite_table(tenant_id)}(rowid, title, text) "  # noqa: S608 (an int in the name)
                   "SELECT id, title, text FROM knowledge_chunk WHERE tenant_id = %s", [int(tenant_id)])


def sqlite_tenant_drop(cursor, tenant_id: int) -> None:
    table = sqlite_table(tenant_id)
    for suffix in ("au", "ad", "ai"):
        cursor.execute(f"DROP TRIGGER IF EXISTS {table}_{suffix}")
    cursor.execute(f"DROP TABLE IF EXISTS {table}")


def sqlite_tenant_ids(cursor) -> list[int]:
    """The tenants that have an FTS5 table."""
    cursor.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%' "
                   "AND name GLOB 'knowledge_fts_t[0-9]*'")
    names = [row[0][len("knowledge_fts_t"):] for row in cursor.fetchall()]
    return sorted(int(name) for name in names if name.isdigit())


def tenant_index_ensure(connection, tenant_id: int) -> None:
    """Before a tenant's chunks are written: its FTS5 table exists (SQLite; nothing to do on PostgreSQL)."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            sqlite_tenant_index(cursor, tenant_id)


PG_CONFIG = "english"
POSTGRES_INSTALL = [
    "ALTER TABLE knowledge_chunk ADD COLUMN search tsvector GENERATED ALWAYS AS ("
    f" setweight(to_tsvector('{PG_CONFIG}'::regconfig, coalesce(title, '')), 'A') ||"
    f" setweight(to_tsvector('{PG_CONFIG}'::regconfig, coalesce(text, '')), 'B')) STORED",
    "CREATE INDEX knowledge_chunk_search_gin ON knowledge_chunk USING gin (search) WITH (fastupdate = off)",
]
POSTGRES_UNINSTALL = [
    "DROP INDEX IF EXISTS knowledge_chunk_search_gin",
    "ALTER TABLE knowledge_chunk DROP COLUMN IF EXISTS search",
]


def sqlite_install(schema_editor) -> None:
    """Re-create every tenant's FTS5 table and triggers and re-index them: for migrations that alter the
    chunk table (which drops its triggers)."""
    if schema_editor.connection.vendor != "sqlite":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT id FROM tenancy_tenant UNION SELECT DISTINCT tenant_id FROM knowledge_chunk")
        tenant_ids = {row[0] for row in cursor.fetchall()} | set(sqlite_tenant_ids(cursor))
        for tenant_id in sorted(tenant_ids):
            sqlite_tenant_drop(cursor, tenant_id)
            sqlite_tenant_index(cursor, tenant_id)


# --- queries -----------------------------------------------------------------------------------

# The words of a query, the PostgreSQL tsquery and the FTS5 query of them: common.fulltext (shared with the tool
# search).
