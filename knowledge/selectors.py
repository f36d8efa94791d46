"""Reads: datasets, documents, and ranked full-text search over chunks (knowledge.fts)."""
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connections, transaction
from django.db.models import Count

from knowledge import fts
from knowledge.models import Chunk, Dataset, Document

ALL_DATASETS = "*"
MAX_QUERY_CHARS = 500
MAX_TOP_K = 20
CANDIDATE_CAP = 500  # see matching_terms()
PG_MAX_CANDIDATES = 1000  # ts_rank_cd() costs ~10 µs a row: at most this many are ranked
CANDIDATES_PER_RESULT = 4  # chunks ranked per requested result, so several chunks of one document still leave top_k
HL_START, HL_STOP = "\ue000", "\ue001"  # snippet highlight markers (private-use characters)
_FILTER_KEY = re.compile(r"^[\w .\-]{1,64}$")
FILTER_SCALARS = (str, int, float, bool, type(None))


class InvalidQuery(ValueError):
    """The query, the dataset scope or the filter cannot be searched; the message says why."""


@dataclass
class SearchHit:
    document_id: int
    chunk_id: int
    dataset: str
    title: str
    ordinal: int
    score: float
    snippet_marked: str  # with HL_START / HL_STOP around matched words
    metadata: dict = field(default_factory=dict)
    rank: int = 0

    @property
    def snippet(self) -> str:
        """The snippet for a model: matches in **bold**."""
        return self.snippet_marked.replace(HL_START, "**").replace(HL_STOP, "**")


def datasets_of(tenant):
    return Dataset.objects.for_tenant(tenant).annotate(document_count=Count("documents")).order_by("name")


def documents_of(tenant, dataset=None):
    documents = Document.objects.for_tenant(tenant).select_related("dataset").defer("text")
    if dataset is not None:
        documents = documents.filter(dataset=dataset)
    return documents


# --- validation --------------------------------------------------------------------------------

def clean_query(query) -> list[str]:
    if not isinstance(query, str) or not query.strip():
        raise InvalidQuery("the query is empty: say in a few words what to look for")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidQuery(f"the query is {len(query)} characters long; the limit is {MAX_QUERY_CHARS}: "
                           "search for the key words instead")
    terms = fts.query_terms(query)
    if not terms:
        raise InvalidQuery("the query has no searchable words (only stop words or punctuation)")
    return terms


def clean_filters(filters) -> dict:
    """A metadata filter: {key: value} (equality) or {key: [v1, v2]} (any of); every key must match."""
    if filters in (None, ""):
        return {}
    if not isinstance(filters, dict):
        raise InvalidQuery("the filter must be an object of metadata keys to values")
    for key, value in filters.items():
        if not isinstance(key, str) or not _FILTER_KEY.match(key):
            raise InvalidQuery(f"filter key {key!r}: 1-64 letters, digits, spaces, '_', '.' or '-'")
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, FILTER_SCALARS) for v in values):
            raise InvalidQuery(f"filter {key!r}: use a string, number, true/false, null or a list of those")
    return dict(filters)


def clean_datasets(datasets) -> str | list[str]:
    if datasets in (None, ALL_DATASETS):
        return ALL_DATASETS
    if isinstance(datasets, str):
        return [datasets]
    if not isinstance(datasets, list | tuple) or not all(isinstance(name, str) for name in datasets):
        raise InvalidQuery('datasets must be "*" (all of them) or a list of dataset names')
    return list(datasets)


# --- search ------------------------------------------------------------------------------------

def chunks_search(*, tenant, query: str, datasets=ALL_DATASETS, filters=None, top_k: int = 5,
                  using: str = "default") -> list[SearchHit]:
    """The tenant's best-matching documents for a free-text query, best first (one hit per document,
    its best chunk). `datasets`: "*" for all of the tenant's, or names (unknown names match nothing).
    `filters`: metadata equality per key (a list value means any of). The tenant is always enforced
    in SQL, whatever the other arguments say."""
    terms = clean_query(query)
    filters = clean_filters(filters)
    datasets = clean_datasets(datasets)
    if not 1 <= int(top_k) <= MAX_TOP_K:
        raise InvalidQuery(f"top_k must be between 1 and {MAX_TOP_K}")
    tenant_id = getattr(tenant, "pk", tenant)
    if tenant_id is None:
        raise InvalidQuery("no tenant")
    dataset_ids = None
    if datasets != ALL_DATASETS:
        dataset_ids = sorted(Dataset.objects.for_tenant(tenant_id).filter(name__in=datasets)
                             .values_list("pk", flat=True))
        if not dataset_ids:
            return []
    connection = connections[using]
    if connection.vendor == "postgresql":
        rows = _search_postgres(connection, tenant_id, terms, dataset_ids, filters, top_k)
    elif connection.vendor == "sqlite":
        rows = _search_sqlite(connection, tenant_id, terms, dataset_ids, filters, top_k)
    else:
        raise NotImplementedError(f"no full-text search for {connection.vendor}")
    for position, hit in enumerate(rows, start=1):
        hit.rank = position
    return rows


def _scope_sql(equals, tenant_id: int, dataset_ids, filters: dict) -> tuple[str, list]:
    """The WHERE clause of the search scope; `equals(key, value)` is the vendor's metadata test."""
    clauses, params = ["c.tenant_id = %s"], [tenant_id]
    if dataset_ids is not None:
        clauses.append(f"c.dataset_id IN ({', '.join(['%s'] * len(dataset_ids))})")
        params.extend(dataset_ids)
    for key, value in filters.items():
        options = value if isinstance(value, list) else [value]
        if not options:
            clauses.append("1 = 0")  # "any of nothing"
            continue
        parts = []
        for option in options:
            sql, option_params = equals(key, option)
            parts.append(sql)
            params.extend(option_params)
        clauses.append("(" + " OR ".join(parts) + ")")
    return " AND ".join(clauses), params


def _pg_equals(key: str, value) -> tuple[str, list]:
    return "c.metadata @> %s::jsonb", [json.dumps({key: value})]


def _sqlite_equals(key: str, value) -> tuple[str, list]:
    path = f'$."{key}"'
    if value is None:
        return "json_type(c.metadata, %s) = 'null'", [path]
    if isinstance(value, bool):
        return f"json_type(c.metadata, %s) = '{'true' if value else 'false'}'", [path]
    if isinstance(value, int | float):
        return ("(json_type(c.metadata, %s) IN ('integer', 'real') AND json_extract(c.metadata, %s) = %s)",
                [path, path, value])
    return "(json_type(c.metadata, %s) = 'text' AND json_extract(c.metadata, %s) = %s)", [path, path, value]


def _sqlite_term_counts(cursor, table: str, terms: list[str]) -> list[int]:
    """How many of the tenant's chunks hold each term (its FTS table is its own), counted up to
    CANDIDATE_CAP + 1 by walking the term's doclist only (no row is read): cheap, and the measure of what
    the term costs to match."""
    one = f"(SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {table} MATCH %s LIMIT %s))"  # noqa: S608
    args: list = []
    for term in terms:
        args.extend([fts.sqlite_match([term]), CANDIDATE_CAP + 1])
    cursor.execute("SELECT " + ", ".join([one] * len(terms)), args)
    return list(cursor.fetchone())


def _pg_term_counts(cursor, tenant_id: int, terms: list[str]) -> list[int]:
    """How many of the tenant's chunks hold each term, from `knowledge_lexeme` (kept by triggers on the
    chunk table, migration 0004): one indexed read, whatever the corpus. A term the configuration drops
    (a stop word) counts 0; one that splits into several lexemes counts as its rarest."""
    cursor.execute(
        "SELECT u.n, min(coalesce(k.chunks, 0)) FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, n)"  # noqa: S608
        f" CROSS JOIN LATERAL unnest(tsvector_to_array(to_tsvector('{fts.PG_CONFIG}'::regconfig, u.t))) AS l(lexeme)"
        " LEFT JOIN knowledge_lexeme k ON k.tenant_id = %s AND k.lexeme = l.lexeme GROUP BY u.n",
        [terms, tenant_id])
    counts = dict(cursor.fetchall())
    return [int(counts.get(n, 0)) for n in range(1, len(terms) + 1)]


def matching_terms(terms: list[str], counts: list[int]) -> tuple[list[str], bool]:
    """The terms a search matches on, and whether the candidates must be capped.

    Ranking every chunk that holds a very common word costs time in proportion to the corpus. Like
    Lucene's common-terms query: when some query words are selective (at most CANDIDATE_CAP of the
    tenant's chunks hold each: counted on the tenant's FTS5 doclist on SQLite, read from the per-tenant
    lexeme counts on PostgreSQL), only they select and rank candidates; a word in thousands of chunks
    says little about relevance (its IDF is near zero). When every word is common, all of them match but
    only the first CANDIDATE_CAP candidates found are ranked: the work stays bounded. The counts are the
    tenant's own, so another tenant's corpus never changes which words select. Which chunks can be
    returned never depends on this: the scope is in the SQL of every query."""
    present = [(term, count) for term, count in zip(terms, counts, strict=True) if count]
    rare = [term for term, count in present if count <= CANDIDATE_CAP]
    if rare:
        return rare, False
    return [term for term, _ in present], True


@contextmanager
def _bitmap_scans_only(cursor):
    """Match through the GIN index, always. With a LIMIT, the planner often prefers a sequential scan or
    the tenant index, evaluating @@ row by row (it underestimates that cost by far): 50 ms instead of 1 ms
    at 10,000 chunks. Set for this transaction only, and restored before it goes on."""
    cursor.execute("SELECT current_setting('enable_seqscan'), current_setting('enable_indexscan')")
    seqscan, indexscan = cursor.fetchone()
    cursor.execute("SELECT set_config('enable_seqscan', 'off', true), set_config('enable_indexscan', 'off', true)")
    try:
        yield
    finally:
        cursor.execute("SELECT set_config('enable_seqscan', %s, true), set_config('enable_indexscan', %s, true)",
                       [seqscan, indexscan])


def _search_postgres(connection, tenant_id, terms, dataset_ids, filters, top_k) -> list[SearchHit]:
    scope, params = _scope_sql(_pg_equals, tenant_id, dataset_ids, filters)
    config = fts.PG_CONFIG
    headline_options = (f"StartSel={HL_START}, StopSel={HL_STOP}, MaxWords=45, MinWords=20, "
                        "MaxFragments=2, FragmentDelimiter=\" … \"")
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor, _bitmap_scans_only(cursor):
        terms, capped = matching_terms(terms, _pg_term_counts(cursor, tenant_id, terms))
        if not terms:
            return []
        # ts_rank_cd knows no inverse document frequency: a chunk repeating one query word could outrank
        # one that has most of them, so the rank is multiplied by how many distinct query words it has.
        term_slots = ", ".join([f"to_tsquery('{config}'::regconfig, %s)"] * len(terms))
        # Interpolated: fixed identifiers and %s placeholders only; every value is a parameter.
        sql = f"""
            WITH q AS (SELECT to_tsquery('{config}'::regconfig, %s) AS query, ARRAY[{term_slots}]::tsquery[] AS terms),
            candidates AS (
                SELECT c.id, c.document_id, c.search FROM knowledge_chunk c, q
                WHERE {scope} AND c.search @@ q.query
                LIMIT %s
            ),
            ranked AS (
                SELECT id, document_id,
                       ts_rank_cd(search, q.query, 1)
                       * (SELECT count(*) FROM unnest(q.terms) AS t(term) WHERE search @@ t.term) AS score
                FROM candidates, q
                ORDER BY score DESC, id
                LIMIT %s
            ),
            best AS (
                SELECT DISTINCT ON (document_id) id, document_id, score FROM ranked
                ORDER BY document_id, score DESC, id
            ),
            top AS (SELECT id, score FROM best ORDER BY score DESC, id LIMIT %s)
            SELECT c.id, c.document_id, ds.name, c.title, c.ordinal, top.score, c.metadata,
                   ts_headline('{config}'::regconfig, c.text, q.query, %s)
            FROM top JOIN knowledge_chunk c ON c.id = top.id
            JOIN knowledge_dataset ds ON ds.id = c.dataset_id, q
            WHERE c.tenant_id = %s
            ORDER BY top.score DESC, c.id
        """  # noqa: S608
        limit = CANDIDATE_CAP if capped else min(CANDIDATE_CAP * len(terms), PG_MAX_CANDIDATES)
        cursor.execute(sql, [fts.postgres_tsquery(terms), *terms, *params, limit, top_k * CANDIDATES_PER_RESULT,
                             top_k, headline_options, tenant_id])
        rows = cursor.fetchall()
    return [
        SearchHit(chunk_id=r[0], document_id=r[1], dataset=r[2], title=r[3], ordinal=r[4], score=float(r[5]),
                  metadata=json.loads(r[6]), snippet_marked=r[7])  # Django reads jsonb as text; never NULL
        for r in rows
    ]


def _search_sqlite(connection, tenant_id, terms, dataset_ids, filters, top_k) -> list[SearchHit]:
    scope, params = _scope_sql(_sqlite_equals, tenant_id, dataset_ids, filters)
    table = fts.sqlite_table(tenant_id)  # the tenant's own: bm25()'s statistics are the tenant's
    with connection.cursor() as cursor:
        if not fts.sqlite_table_exists(cursor, tenant_id):
            return []  # nothing was ever indexed for this tenant
        terms, capped = matching_terms(terms, _sqlite_term_counts(cursor, table, terms))
        if not terms:
            return []
        match = fts.sqlite_match(terms)
        # bm25() is lower-is-better; the score is its negation. Title weighs 3, text 1. The candidates
        # subquery has a LIMIT, so bm25() is computed only for the candidates it yields.
        sql = f"""
            WITH candidates AS (
                SELECT c.id, c.document_id, -bm25({table}, 3.0, 1.0) AS score
                FROM {table} JOIN knowledge_chunk c ON c.id = {table}.rowid
                WHERE {table} MATCH %s AND {scope}
                LIMIT %s
            ),
            ranked AS (SELECT id, document_id, score FROM candidates ORDER BY score DESC, id LIMIT %s),
            best AS (
                SELECT id, document_id, score,
                       row_number() OVER (PARTITION BY document_id ORDER BY score DESC, id) AS n
                FROM ranked
            )
            SELECT c.id, c.document_id, ds.name, c.title, c.ordinal, best.score, c.metadata
            FROM best JOIN knowledge_chunk c ON c.id = best.id JOIN knowledge_dataset ds ON ds.id = c.dataset_id
            WHERE best.n = 1 AND c.tenant_id = %s
            ORDER BY best.score DESC, c.id
            LIMIT %s
        """  # noqa: S608
        limit = CANDIDATE_CAP if capped else CANDIDATE_CAP * len(terms)
        cursor.execute(sql, [match, *params, limit, top_k * CANDIDATES_PER_RESULT, tenant_id, top_k])
        rows = cursor.fetchall()
        if not rows:
            return []
        ids = [r[0] for r in rows]
        cursor.execute(
            f"SELECT rowid, snippet({table}, 1, %s, %s, '…', 32) FROM {table} "  # noqa: S608
            f"WHERE {table} MATCH %s AND rowid IN ({', '.join(['%s'] * len(ids))})",
            [HL_START, HL_STOP, match, *ids],
        )
        snippets = dict(cursor.fetchall())
    return [
        SearchHit(chunk_id=r[0], document_id=r[1], dataset=r[2], title=r[3], ordinal=r[4], score=float(r[5]),
                  metadata=json.loads(r[6]),  # JSON text, never NULL
                  snippet_marked=snippets.get(r[0], ""))
        for r in rows
    ]


def chunk_count(tenant) -> int:
    return Chunk.objects.for_tenant(tenant).count()
