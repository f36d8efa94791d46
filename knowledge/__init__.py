"""Knowledge bases and the `knowledge_search` tool (docs/notes/knowledge-and-skills.md).

- Models: Dataset(tenant, name), Document(tenant, dataset, external_id, title, text, metadata,
  content_hash, chunk_count), Chunk(tenant, document, dataset, ordinal, title, text, metadata copy).
- Full-text search on the database in use (knowledge/fts.py): SQLite FTS5 + bm25() + snippet();
  PostgreSQL generated tsvector + GIN (fastupdate off) + ts_rank_cd() + ts_headline().
- Retrieval scope: `knowledge_search(query, top_k, datasets, filter)`. The knowledge app binds
  `datasets="*"` (all of the tenant's) and `filter={}` (none) tenant-wide for every tenant, so both
  arguments are always removed from the schema a model sees; per-agent bindings narrow them. If the
  tenant-wide bindings are deleted, the tool itself still refuses model-sent values and falls back to
  the same default. The tenant is never an argument.
- Ingest is idempotent: a document is identified by (dataset, external_id), the external id
  defaulting to the title; an identical re-ingest is a no-op, a changed one updates in place.
  Bulk ingest validates every document first, then writes batches of 100 in their own transactions,
  reporting progress (synchronous for now).
- Query cost is bounded: words held by more than CANDIDATE_CAP of the tenant's chunks do not select
  candidates when rarer words exist, and when every word is that common only CANDIDATE_CAP
  candidates are ranked (knowledge.selectors.matching_terms). Ranking statistics are the tenant's own.
"""
