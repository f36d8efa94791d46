"""The tool search: which tools a session may see match a free-text query (docs/governance.md#tool-search).

Policy comes first. The candidates are the tools of the session's reachable groups
(`selectors.reachable_group_names`: its active groups and the switchable ones open to its agent), enabled, of an
enabled server, and not hidden by an exposure filter (a deny rule that always refuses the session's agent and
user). A tool outside them is never returned, and its name is not in any message: the search cannot tell a
hidden tool from a missing one.

The text searched is a tool's name (its `_`, `.` and `-` read as spaces), its description and its input
schema's property names and descriptions, weighted in that order.

Both databases rank with their own full-text index, the same way: the tools of the tenant, enabled, holding every
word of the query first, then, when they are fewer than a page, those holding any; a statement ranks at most
CANDIDATE_CAP matches (the first it finds). The reachable groups and the exposure filters are applied to that page
in memory (from the catalog snapshot), and a page they thin out is read again, four times larger, until enough
remain or the matches end.

- PostgreSQL: the generated, stored `tools_tool.search` tsvector (migration 0015; names weight A, description B,
  schema C, the `english` configuration) with a GIN index, ranked with ts_rank_cd().
- SQLite (the embedded mode): the FTS5 table `tools_tool_fts` (migration 0016; Porter stemming), kept by
  triggers on `tools_tool`, ranked with bm25() weighting the name, the description and the schema as
  PostgreSQL's A, B and C (1, 0.4, 0.2). Its column `tenant` holds `t<tenant id>`, and the query requires it,
  so a statement reads one tenant's rows. bm25() takes its statistics from the whole table, so another tenant's
  catalog can change the order of a tenant's hits, never which tools are found.

The query is hostile input: at most `meta.QUERY_MAX` characters, cut into plain words by
`common.fulltext.query_terms` (no word carries tsquery syntax; for FTS5 each is a quoted string,
`common.fulltext.sqlite_match`), and passed as a parameter.
"""
from dataclasses import dataclass

from django.db import connection

from common.errors import ServiceError
from common.fulltext import postgres_tsquery, query_terms, sqlite_match
from tools.catalog.meta import QUERY_MAX, SEARCH_LIMIT_DEFAULT, SEARCH_LIMIT_MAX, enabled_tool_names
from tools.catalog.registry import exposure_hidden
from tools.catalog.selectors import active_group_names, reachable_group_names
from tools.catalog.snapshot import CatalogSnapshot, catalog_snapshot
from tools.models import AgentSession, Tool

PG_CONFIG = "english"
DESCRIPTION_MAX = 500  # characters of a description a hit carries


@dataclass(frozen=True)
class ToolHit:
    name: str
    description: str
    listed: bool  # already on the session's surface

    def as_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "listed": self.listed}


def search_terms(query) -> list[str]:
    """The words of `query` to search for; ServiceError when it is no text, too long, or has none."""
    if not isinstance(query, str) or not query.strip():
        raise ServiceError({"query": ["describe the tool you need in a few words"]})
    if len(query) > QUERY_MAX:
        raise ServiceError({"query": [f"at most {QUERY_MAX} characters"]})
    terms = query_terms(query)
    if not terms:
        raise ServiceError({"query": ["the query has no searchable words (only stop words or punctuation)"]})
    return terms


def search_limit(limit) -> int:
    if limit is None:
        return SEARCH_LIMIT_DEFAULT
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= SEARCH_LIMIT_MAX:
        raise ServiceError({"limit": [f"a whole number from 1 to {SEARCH_LIMIT_MAX}"]})
    return limit


def tools_search(*, session: AgentSession, query, limit=None) -> list[ToolHit]:
    """The tools this session may see that match `query`, best first, at most `limit`."""
    terms, limit = search_terms(query), search_limit(limit)
    catalog = catalog_snapshot(session.tenant_id)
    reachable = set(reachable_group_names(session, catalog.groups))
    names = {name for group in catalog.groups if group.name in reachable for name in group.tool_names}
    if not names:
        return []
    found: list[str] = []
    fetch = limit * 2 + 10
    while True:
        rows = _ranked(session.tenant_id, terms, fetch)
        candidates = [name for name in rows if name in names]
        hidden = exposure_hidden(tenant=session.tenant, agent=session.agent, user=session.user,
                                 user_verified=session.user_verified, names=candidates)
        found = [name for name in candidates if name not in hidden]
        if len(found) >= limit or len(rows) < fetch:
            break
        fetch *= 4  # policy thinned the page out: read a larger one
    found = found[:limit]
    listed = listed_names(session, catalog, found)
    return [_hit(catalog, name, name in listed) for name in found]


def listed_names(session: AgentSession, catalog: CatalogSnapshot, names: list[str]) -> set[str]:
    """Which of these found tools are on the session's surface already (as `selectors.visible_tool` says)."""
    if not names:
        return set()
    active = set(active_group_names(session, catalog.groups))
    enabled = set(enabled_tool_names(session))
    return {name for name in names
            if name in enabled or any(group.name in active for group in catalog.groups_of_tool.get(name, ()))}


def _hit(catalog: CatalogSnapshot, name: str, listed: bool) -> ToolHit:
    description = catalog.tools[name].description or ""
    if len(description) > DESCRIPTION_MAX:
        description = description[:DESCRIPTION_MAX - 1] + "…"
    return ToolHit(name=name, description=description, listed=listed)


# --- the full-text statements -------------------------------------------------------------------

CANDIDATE_CAP = 400  # matching tools ranked per statement (see _ranked)


def _ranked(tenant_id: int, terms: list[str], fetch: int) -> list[str]:
    """A page of the tenant's enabled tools that match, best first: those holding every word of the query, then,
    when they are fewer than the page, those holding any. Each statement ranks at most CANDIDATE_CAP matches (the
    first it finds), so a word shared by thousands of tools costs what 400 do (ranking costs about 10 µs a row on
    a loaded machine); the tools holding every word, ranked first, keep the best answers within the cap.

    The reachable groups are not a condition here: a semi-join to the memberships for each matching row cost more
    than the ranking (30 ms for a common word at 10,000 tools); the caller keeps the reachable ones and reads a
    larger page when too few remain."""
    statement = _postgres_statement if connection.vendor == "postgresql" else _sqlite_statement
    found = statement(tenant_id, terms, True, fetch)
    if len(found) < fetch and len(terms) > 1:
        seen = set(found)
        found += [name for name in statement(tenant_id, terms, False, fetch + len(found))
                  if name not in seen][:fetch - len(found)]
    return found


def _postgres_statement(tenant_id: int, terms: list[str], every: bool, fetch: int) -> list[str]:
    table = connection.ops.quote_name(Tool._meta.db_table)
    sql = (
        "WITH q AS (SELECT to_tsquery(%s::regconfig, %s) AS query),"  # noqa: S608 (a quoted table name)
        f" c AS (SELECT t.name, t.search FROM {table} t, q"
        "  WHERE t.tenant_id = %s AND t.enabled AND t.search @@ q.query LIMIT %s)"
        " SELECT c.name FROM c, q ORDER BY ts_rank_cd(c.search, q.query) DESC, c.name LIMIT %s"
    )
    tsquery = " & ".join(terms) if every else postgres_tsquery(terms)
    with connection.cursor() as cursor:
        cursor.execute(sql, [PG_CONFIG, tsquery, tenant_id, CANDIDATE_CAP, fetch])
        return [row[0] for row in cursor.fetchall()]


SQLITE_TABLE = "tools_tool_fts"  # migration 0016
SQLITE_WEIGHTS = "0.0, 1.0, 0.4, 0.2"  # bm25() column weights: tenant, name, description, schema


def sqlite_statement_sql(tenant_id: int, terms: list[str], every: bool) -> tuple[str, list]:
    """The SQLite statement and its parameters but the page size (appended last). CROSS JOIN keeps the FTS5
    table the outer loop: otherwise SQLite may walk the tenant's tools and run the MATCH once for each."""
    table = connection.ops.quote_name(Tool._meta.db_table)
    sql = (
        f"WITH c AS (SELECT t.name, bm25({SQLITE_TABLE}, {SQLITE_WEIGHTS}) AS score"  # noqa: S608 (constants)
        f"  FROM {SQLITE_TABLE} CROSS JOIN {table} t ON t.id = {SQLITE_TABLE}.rowid"
        f"  WHERE {SQLITE_TABLE} MATCH %s AND t.tenant_id = %s AND t.enabled LIMIT %s)"
        " SELECT c.name FROM c ORDER BY c.score, c.name LIMIT %s"
    )
    match = (f'tenant : "t{int(tenant_id)}" AND {{name description schema}} : '
             f'({sqlite_match(terms, "AND" if every else "OR")})')
    return sql, [match, tenant_id, CANDIDATE_CAP]


def _sqlite_statement(tenant_id: int, terms: list[str], every: bool, fetch: int) -> list[str]:
    sql, params = sqlite_statement_sql(tenant_id, terms, every)
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, fetch])
        return [row[0] for row in cursor.fetchall()]
