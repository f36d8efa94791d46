"""Ranking depends on the tenant's own chunks only: another tenant's corpus, however large and however
full of this tenant's query words, changes neither which chunks are candidates nor their scores
(knowledge.selectors: per-tenant term counts for candidate selection, per-tenant BM25 statistics on
SQLite; PostgreSQL's ts_rank_cd is per document)."""
import pytest
from django.db import connection

from knowledge import fts, selectors
from knowledge.fts import query_terms
from knowledge.models import Chunk, Document
from knowledge.selectors import CANDIDATE_CAP, chunks_search
from knowledge.services import dataset_create, dataset_delete, documents_ingest_bulk
from tests.knowledge.corpus import RANKING

pytestmark = pytest.mark.django_db

QUERIES = [query for query, _ in RANKING] + ["vacation days laptop", "employee password reset portal",
                                               "deploy release rollback incident"]


def results(tenant) -> dict:
    return {
        (query, top_k): [(hit.document_id, hit.chunk_id, hit.score) for hit in chunks_search(
            tenant=tenant, query=query, top_k=top_k)]
        for query in QUERIES for top_k in (1, 5)
    }


def flood(tenant, words: list[str], documents: int) -> None:
    """A corpus in which every one of `words` is common: each document holds all of them, some twice."""
    dataset = dataset_create(tenant=tenant, name=f"flood-{len(words)}-{documents}")
    documents_ingest_bulk(tenant=tenant, dataset=dataset, batch_size=500, documents=[
        {"title": f"{words[n % len(words)]} notes {n}",
         "text": " ".join(words) + f" {words[(n * 7) % len(words)]} entry {n}."}
        for n in range(documents)
    ])


def test_another_tenants_corpus_never_changes_your_results_or_scores(kb, monkeypatch):
    monkeypatch.setattr(selectors, "_PG_STATS_TTL_S", 0, raising=False)  # any planner statistics read fresh
    a, b = kb.world.a.tenant, kb.world.b.tenant
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE knowledge_chunk")
    before = results(a)
    assert all(before.values()), "every query finds something in A's corpus"

    # One word of each query made common (beyond CANDIDATE_CAP chunks) by B alone, the others left rare.
    words = sorted({query_terms(query)[0] for query in QUERIES})
    flood(b, words, documents=CANDIDATE_CAP + 200)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE knowledge_chunk")
    assert chunks_search(tenant=b, query=QUERIES[0], top_k=1), "B's corpus matches A's queries"

    assert results(a) == before


def indexed_counts(tenant, words: list[str]) -> dict[str, int]:
    """How many of the tenant's chunks the search index says hold each word."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            table = fts.sqlite_table(tenant.pk)
            return {word: cursor.execute(f"SELECT count(*) FROM {table} WHERE {table} MATCH %s",  # noqa: S608
                                         [word]).fetchone()[0] for word in words}
        return dict(zip(words, selectors._pg_term_counts(cursor, tenant.pk, words), strict=True))


def stored_counts(tenant, words: list[str]) -> dict[str, int]:
    """The same, counted on the chunks themselves."""
    chunks = list(Chunk.objects.for_tenant(tenant).values_list("title", "text"))
    return {word: sum(1 for title, text in chunks if word in f"{title} {text}".lower().split()) for word in words}


def test_the_tenants_counts_follow_ingest_reingest_and_deletes(kb):
    a, b = kb.world.a.tenant, kb.world.b.tenant
    words = ["zanzibar", "quokka", "marmalade"]
    notes = dataset_create(tenant=a, name="notes")
    docs = [{"title": f"Note {n}", "external_id": f"n{n}",
             "text": " ".join(words[: 1 + n % 3]) + f" filler {n}"} for n in range(12)]
    documents_ingest_bulk(tenant=a, dataset=notes, documents=docs)
    flood(b, words, documents=30)  # another tenant's chunks never count for A
    assert indexed_counts(a, words) == stored_counts(a, words) == {"zanzibar": 12, "quokka": 8, "marmalade": 4}

    docs[0]["text"], docs[1]["text"] = "quokka only now", "nothing of the kind"
    documents_ingest_bulk(tenant=a, dataset=notes, documents=docs[:2])  # re-ingest: chunks replaced
    Document.objects.for_tenant(a).get(dataset=notes, external_id="n2").delete()
    assert indexed_counts(a, words) == stored_counts(a, words) == {"zanzibar": 9, "quokka": 7, "marmalade": 3}

    dataset_delete(dataset=notes)
    assert indexed_counts(a, words) == {"zanzibar": 0, "quokka": 0, "marmalade": 0}
    assert indexed_counts(b, words) == stored_counts(b, words) == {word: 30 for word in words}

