"""The tool search: which tools a session may see match a free-text query (docs/governance.md#tool-search).

Policy comes first. The candidates are the tools of the session's reachable groups
(`selectors.reachable_group_names`: its active groups and the switchable ones open to its agent), enabled, of an
enabled server, and not hidden by an exposure filter (a deny rule that always refuses the session's agent and
user). A tool outside them is never returned, and its name is not in any message: the search cannot tell a
hidden tool from a missing one.

The text searched is a tool's name (its `_`, `.` and `-` read as spaces), its description and its input
schema's property names and descriptions, weighted in that order.

- PostgreSQL: the generated, stored `tools_tool.search` tsvector (migration 0013; names weight A, description B,
  schema C, the `english` configuration) with a GIN index; the query's words OR-ed into a tsquery, ranked with
  ts_rank_cd(). The tenant and the reachable groups are conditions of the statement; the exposure filters run
  on the ranked rows, and a page they thin out is read again, larger.
- SQLite (the embedded mode): no index in the database. Each catalog snapshot keeps a vocabulary of its tools'
  words (built on the first search of that catalog version), and a query word matches the words it begins
  after a light suffix stripping; a match in the name counts 3, in the description 2, in the schema 1.

The query is hostile input: at most `meta.QUERY_MAX` characters, cut into plain words by
`common.fulltext.query_terms` (no word carries tsquery syntax), and passed as a parameter.
"""
import re
from dataclasses import dataclass

from django.db import connection

from common.errors import ServiceError
from common.fulltext import postgres_tsquery, query_terms
from tools.catalog.meta import QUERY_MAX, SEARCH_LIMIT_DEFAULT, SEARCH_LIMIT_MAX
from tools.catalog.registry import exposure_hidden
from tools.catalog.selectors import reachable_group_names, visible_tool
from tools.catalog.snapshot import CatalogSnapshot, catalog_snapshot
from tools.models import AgentSession, Tool, ToolGroup

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
    group_ids = [group.id for group in catalog.groups if group.name in reachable]
    names = {name for group in catalog.groups if group.name in reachable for name in group.tool_names}
    if not names:
        return []
    ranked = _ranked_postgres if connection.vendor == "postgresql" else _ranked_snapshot
    found: list[str] = []
    fetch = limit * 2 + 10
    while True:
        rows = ranked(catalog=catalog, tenant_id=session.tenant_id, terms=terms, group_ids=group_ids,
                      names=names, fetch=fetch)
        candidates = [name for name in rows if name in names]
        hidden = exposure_hidden(tenant=session.tenant, agent=session.agent, user=session.user,
                                 user_verified=session.user_verified, names=candidates)
        found = [name for name in candidates if name not in hidden]
        if len(found) >= limit or len(rows) < fetch:
            break
        fetch *= 4  # the exposure filters thinned the page out: read a larger one
    return [_hit(session, catalog, name) for name in found[:limit]]


def _hit(session: AgentSession, catalog: CatalogSnapshot, name: str) -> ToolHit:
    description = catalog.tools[name].description or ""
    if len(description) > DESCRIPTION_MAX:
        description = description[:DESCRIPTION_MAX - 1] + "…"
    return ToolHit(name=name, description=description, listed=visible_tool(session, name) is not None)


# --- PostgreSQL ----------------------------------------------------------------------------------

def _ranked_postgres(*, catalog, tenant_id: int, terms: list[str], group_ids: list[int], names, fetch: int
                     ) -> list[str]:
    quote = connection.ops.quote_name
    tool_table = quote(Tool._meta.db_table)
    members = ToolGroup.tools.through
    member_table = quote(members._meta.db_table)
    sql = (
        f"SELECT t.name FROM {tool_table} t, to_tsquery(%s::regconfig, %s) AS q(query)"  # noqa: S608 (quoted names)
        f" WHERE t.tenant_id = %s AND t.enabled AND t.search @@ q.query"
        f" AND EXISTS (SELECT 1 FROM {member_table} m WHERE m.tool_id = t.id AND m.toolgroup_id = ANY(%s))"
        f" ORDER BY ts_rank_cd(t.search, q.query) DESC, t.name LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [PG_CONFIG, postgres_tsquery(terms), tenant_id, list(group_ids), fetch])
        return [row[0] for row in cursor.fetchall()]


# --- the snapshot's vocabulary (SQLite) ------------------------------------------------------------

_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
_SUFFIXES = ("ing", "ies", "es", "ed", "s")
NAME_WEIGHT, DESCRIPTION_WEIGHT, SCHEMA_WEIGHT = 3, 2, 1


def stem(word: str) -> str:
    """A light stemming, so "issues" finds "issue" and "creating" finds "create"."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[:-len(suffix)]
    return word


def words(text: str) -> set[str]:
    return {stem(token) for token in _TOKEN.findall(text.lower())}


def schema_text(schema, depth: int = 0) -> list[str]:
    """The property names and descriptions of a JSON Schema, at any depth (as migration 0013 reads them)."""
    if depth > 32:
        return []
    found: list[str] = []
    if isinstance(schema, dict):
        properties = schema.get("properties")
        if isinstance(properties, dict):
            found += [key for key in properties if isinstance(key, str)]
        description = schema.get("description")
        if isinstance(description, str):
            found.append(description)
        for value in schema.values():
            if isinstance(value, dict | list):
                found += schema_text(value, depth + 1)
    elif isinstance(schema, list):
        for item in schema:
            found += schema_text(item, depth + 1)
    return found


def _vocabulary(catalog: CatalogSnapshot) -> dict[str, dict[str, int]]:
    """word → {tool name: weight}, built once per catalog snapshot."""
    vocabulary = catalog.search_vocabulary
    if vocabulary is None:
        vocabulary = {}
        for name, tool in catalog.tools.items():
            for weight, text in ((SCHEMA_WEIGHT, " ".join(schema_text(tool.input_schema))),
                                 (DESCRIPTION_WEIGHT, tool.description or ""), (NAME_WEIGHT, name)):
                for word in words(text):
                    weights = vocabulary.setdefault(word, {})
                    weights[name] = max(weights.get(name, 0), weight)
        catalog.search_vocabulary = vocabulary
    return vocabulary


def _ranked_snapshot(*, catalog, tenant_id: int, terms: list[str], group_ids, names, fetch: int) -> list[str]:
    vocabulary = _vocabulary(catalog)
    scores: dict[str, int] = {}
    for stemmed in {stem(part) for term in terms for part in _TOKEN.findall(term)}:
        best: dict[str, int] = {}
        for word, weights in vocabulary.items():
            if word.startswith(stemmed):
                for name, weight in weights.items():
                    if name in names and weight > best.get(name, 0):
                        best[name] = weight
        for name, weight in best.items():
            scores[name] = scores.get(name, 0) + weight
    return sorted(scores, key=lambda name: (-scores[name], name))[:fetch]
