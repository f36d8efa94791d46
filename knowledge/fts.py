"""The full-text index behind `Chunk`, per database vendor.

SQLite: an external-content FTS5 table `knowledge_chunk_fts(title, text)` (Porter stemming),
kept in sync with `knowledge_chunk` by triggers, ranked with bm25() (title weighted 3:1),
snippets from snippet().

PostgreSQL: a generated, stored `tsvector` column `knowledge_chunk.search` (title weight A,
text weight B, the `english` configuration) with a GIN index, ranked with ts_rank_cd(),
snippets from ts_headline(); a second GIN index on `metadata` (migration 0003) serves bound filters.
Both GIN indexes are built with fastupdate off: a pending list left by a bulk ingest makes the
planner shun the index and scans slow (50 ms instead of 1 ms at 10,000 chunks); it costs ingest
speed instead.

Caution for later migrations: on SQLite, Django rebuilds a table to alter it, which drops its
triggers. A migration that alters `knowledge_chunk` must call `sqlite_install(schema_editor)`
again afterwards (it is idempotent and re-indexes every chunk). On PostgreSQL, `title` and `text`
cannot change type while the generated column uses them.
"""
import re

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


def _run(schema_editor, statements) -> None:
    for statement in statements:
        schema_editor.execute(statement, params=None)


def sqlite_install(schema_editor) -> None:
    """Re-create the FTS5 table and triggers (idempotent) and re-index: for migrations that alter the table."""
    if schema_editor.connection.vendor == "sqlite":
        _run(schema_editor, SQLITE_INSTALL)


# --- queries -----------------------------------------------------------------------------------

# PostgreSQL's `english` stop words, so both backends ignore the same words in a query.
_STOP_WORDS_TEXT = """
a about above after again against all am an and any are as at be because been before being below between both
but by can did do does doing don down during each few for from further had has have having he her here hers
herself him himself his how i if in into is it its itself just me more most my myself no nor not now of off on
once only or other our ours ourselves out over own s same she should so some such t than that the their theirs
them themselves then there these they this those through to too under until up very was we were what when
where which while who whom why will with you your yours yourself yourselves
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())
MAX_TERMS = 24
_WORD = re.compile(r"\w+", re.UNICODE)


def query_terms(query: str) -> list[str]:
    """The words of a free-text query worth searching for: lower-cased, stop words out, each once."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        word = word.strip("_")
        if word and word not in STOP_WORDS and len(word) <= 64:
            seen.setdefault(word, None)
    return list(seen)[:MAX_TERMS]


def sqlite_match(terms: list[str]) -> str:
    """An FTS5 query matching any of the terms (bm25 favours chunks with more of them). Each term is
    a quoted string, so nothing in a query is FTS syntax."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


def postgres_tsquery(terms: list[str]) -> str:
    """The text for to_tsquery(): terms OR-ed. Terms are \\w+ runs, so they carry no tsquery syntax."""
    return " | ".join(terms)
