"""The tenant and dataset scope of knowledge search, its validation messages, the fields of a hit and the
candidate cap, pinned exactly (knowledge.selectors)."""
import json
from types import SimpleNamespace

import pytest
from django.db import connection
from django.db.utils import ConnectionHandler

from knowledge import fts, selectors
from knowledge.models import Chunk, Dataset, Document
from knowledge.selectors import (
    ALL_DATASETS,
    CANDIDATE_CAP,
    HL_START,
    HL_STOP,
    InvalidQuery,
    chunk_count,
    chunks_search,
    clean_datasets,
    clean_filters,
    clean_query,
    datasets_of,
    documents_of,
    matching_terms,
)
from knowledge.services import dataset_create, document_ingest
from tests.knowledge.corpus import DOCUMENTS


def raised_message(error_type, call) -> str:
    with pytest.raises(error_type) as raised:
        call()
    return str(raised.value)


# --- validation (no database) ------------------------------------------------------------------

def test_clean_query_keeps_the_searchable_words_in_order():
    assert clean_query("The VPN and the laptop, the VPN!") == ["vpn", "laptop"]
    assert clean_query("vpn " * 125) == ["vpn"]  # exactly the limit of 500 characters


@pytest.mark.parametrize("query", [None, 42, "", "   \n\t"])
def test_clean_query_refuses_an_empty_query_with_the_exact_message(query):
    assert raised_message(InvalidQuery, lambda: clean_query(query)) == (
        "the query is empty: say in a few words what to look for")


def test_clean_query_refuses_an_overlong_query_with_the_exact_message():
    assert raised_message(InvalidQuery, lambda: clean_query("vpn " * 125 + "x")) == (
        "the query is 501 characters long; the limit is 500: search for the key words instead")


def test_clean_query_refuses_stop_words_only_with_the_exact_message():
    assert raised_message(InvalidQuery, lambda: clean_query("the and of ... !")) == (
        "the query has no searchable words (only stop words or punctuation)")


def test_clean_filters_accepts_no_filter_and_copies_a_valid_one():
    assert clean_filters(None) == {}
    assert clean_filters("") == {}
    assert clean_filters({}) == {}
    given = {"department": ["hr", "finance"], "level": 3, "ratio": 0.5, "public": True, "owner": None,
             "team.name-x 1": "ops"}
    cleaned = clean_filters(given)
    assert cleaned == given
    assert cleaned is not given


@pytest.mark.parametrize("filters", [["department", "hr"], "department=hr", 3])
def test_clean_filters_refuses_a_non_object_with_the_exact_message(filters):
    assert raised_message(InvalidQuery, lambda: clean_filters(filters)) == (
        "the filter must be an object of metadata keys to values")


@pytest.mark.parametrize("key", [1, None, 'bad"key', "", "k" * 65, "a/b"])
def test_clean_filters_refuses_a_bad_key_with_the_exact_message(key):
    assert raised_message(InvalidQuery, lambda: clean_filters({key: "x"})) == (
        f"filter key {key!r}: 1-64 letters, digits, spaces, '_', '.' or '-'")


@pytest.mark.parametrize("value", [{"nested": 1}, ["hr", {"nested": 1}], [["hr"]], ("hr",)])
def test_clean_filters_refuses_a_non_scalar_value_with_the_exact_message(value):
    assert raised_message(InvalidQuery, lambda: clean_filters({"department": value})) == (
        "filter 'department': use a string, number, true/false, null or a list of those")


def test_clean_datasets_reads_all_one_or_several_names():
    assert clean_datasets(None) == ALL_DATASETS
    assert clean_datasets("*") == ALL_DATASETS
    assert clean_datasets("archive") == ["archive"]
    assert clean_datasets(("handbook", "archive")) == ["handbook", "archive"]
    names = ["handbook"]
    assert clean_datasets(names) == ["handbook"] and clean_datasets(names) is not names
    assert clean_datasets([]) == []


@pytest.mark.parametrize("datasets", [5, {"handbook": 1}, ["handbook", 3], [None]])
def test_clean_datasets_refuses_anything_else_with_the_exact_message(datasets):
    assert raised_message(InvalidQuery, lambda: clean_datasets(datasets)) == (
        'datasets must be "*" (all of them) or a list of dataset names')


def test_matching_terms_selects_on_the_rare_words_only():
    assert matching_terms(["common", "absent", "rare", "edge"], [CANDIDATE_CAP + 1, 0, 3, CANDIDATE_CAP]) == (
        ["rare", "edge"], False)


def test_matching_terms_caps_the_candidates_when_every_present_word_is_common():
    assert matching_terms(["common", "absent", "frequent"], [CANDIDATE_CAP + 1, 0, 9000]) == (
        ["common", "frequent"], True)
    assert matching_terms(["absent"], [0]) == ([], True)


def test_matching_terms_refuses_counts_that_do_not_match_the_terms():
    with pytest.raises(ValueError, match="zip"):
        matching_terms(["vpn"], [1, 2])


@pytest.mark.parametrize("top_k", [0, -1, 21])
def test_top_k_out_of_range_is_refused_with_the_exact_message(top_k):
    assert raised_message(InvalidQuery, lambda: chunks_search(tenant=1, query="vpn", top_k=top_k)) == (
        "top_k must be between 1 and 20")


def test_a_search_without_tenant_is_refused_with_the_exact_message():
    assert raised_message(InvalidQuery, lambda: chunks_search(tenant=None, query="vpn")) == "no tenant"
    no_pk = SimpleNamespace(pk=None)
    assert raised_message(InvalidQuery, lambda: chunks_search(tenant=no_pk, query="vpn")) == "no tenant"


def test_a_database_without_full_text_search_is_refused_with_the_exact_message(monkeypatch):
    monkeypatch.setattr(selectors, "connections", {"default": SimpleNamespace(vendor="mysql")})
    assert raised_message(NotImplementedError, lambda: chunks_search(tenant=1, query="vpn")) == (
        "no full-text search for mysql")


# --- reads -------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_datasets_of_lists_the_tenants_datasets_by_name_with_document_counts(kb):
    a, b = kb.world.a.tenant, kb.world.b.tenant
    dataset_create(tenant=a, name="empty")
    assert [(d.name, d.document_count) for d in datasets_of(a)] == [
        ("archive", 1), ("empty", 0), ("handbook", len(DOCUMENTS))]
    assert [(d.name, d.document_count) for d in datasets_of(b)] == [("handbook", 1)]


@pytest.mark.django_db
def test_documents_of_is_the_tenants_documents_optionally_of_one_dataset(kb, django_assert_num_queries):
    a, b = kb.world.a.tenant, kb.world.b.tenant
    assert sorted(d.title for d in documents_of(a)) == sorted([title for title, _, _ in DOCUMENTS] + ["Old VPN notes"])
    assert [d.title for d in documents_of(a, kb.archive)] == ["Old VPN notes"]
    assert [d.title for d in documents_of(b)] == ["VPN Setup Guide"]
    assert list(documents_of(a, kb.b_handbook)) == []
    with django_assert_num_queries(1):
        documents = list(documents_of(a, kb.handbook))
        assert {d.dataset.name for d in documents} == {"handbook"}  # joined, not one query per document
        assert all(d.get_deferred_fields() == {"text"} for d in documents)


@pytest.mark.django_db
def test_chunk_count_counts_the_tenants_chunks_only(kb):
    a, b = kb.world.a.tenant, kb.world.b.tenant
    own = Chunk.objects.filter(tenant=a).count()
    assert own >= len(DOCUMENTS) + 1
    assert chunk_count(a) == own
    assert chunk_count(b) == Chunk.objects.filter(tenant=b).count() == 1


# --- search: scope, filters, fields ------------------------------------------------------------

def titles(hits) -> list[str]:
    return [h.title for h in hits]


@pytest.mark.django_db
def test_top_k_defaults_to_five_and_ranks_count_from_one(kb):
    a = kb.world.a.tenant
    query = "employee laptop request policy VPN"
    every = chunks_search(tenant=a, query=query, top_k=20)
    assert len(every) > 5
    hits = chunks_search(tenant=a, query=query)
    assert titles(hits) == titles(every)[:5]
    assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
    assert [h.rank for h in every] == list(range(1, len(every) + 1))
    assert titles(chunks_search(tenant=a, query=query, top_k=1)) == titles(every)[:1]
    assert titles(chunks_search(tenant=a, query=query, top_k=3)) == titles(every)[:3]


@pytest.mark.django_db
def test_a_tenant_id_searches_like_the_tenant(kb):
    a = kb.world.a.tenant
    by_object = chunks_search(tenant=a, query="WireGuard VPN laptop", top_k=10)
    by_id = chunks_search(tenant=a.pk, query="WireGuard VPN laptop", top_k=10)
    assert by_object and [(h.chunk_id, h.score) for h in by_id] == [(h.chunk_id, h.score) for h in by_object]


@pytest.mark.django_db
def test_named_datasets_limit_the_search_to_the_tenants_datasets_of_those_names(kb):
    a, b = kb.world.a.tenant, kb.world.b.tenant
    assert titles(chunks_search(tenant=a, query="VPN", datasets=["archive"], top_k=20)) == ["Old VPN notes"]
    assert titles(chunks_search(tenant=a, query="VPN", datasets="archive", top_k=20)) == ["Old VPN notes"]
    handbook = chunks_search(tenant=a, query="VPN", datasets=["handbook"], top_k=20)
    assert {h.dataset for h in handbook} == {"handbook"}
    assert {h.document_id for h in handbook} <= set(documents_of(a, kb.handbook).values_list("pk", flat=True))
    both = chunks_search(tenant=a, query="VPN", datasets=["handbook", "archive"], top_k=20)
    assert {h.dataset for h in both} == {"handbook", "archive"}
    assert sorted(titles(both)) == sorted(titles(chunks_search(tenant=a, query="VPN", top_k=20)))
    assert chunks_search(tenant=a, query="VPN", datasets=["no-such"]) == []
    assert chunks_search(tenant=a, query="VPN", datasets=[]) == []
    # B's dataset of the same name holds B's document only
    assert titles(chunks_search(tenant=b, query="VPN", datasets=["handbook"])) == ["VPN Setup Guide"]
    assert chunks_search(tenant=b, query="VPN", datasets=["archive"]) == []


@pytest.mark.django_db
def test_filters_keep_only_chunks_whose_metadata_matches(kb):
    a = kb.world.a.tenant
    query = "policy laptop VPN leave expense"
    unfiltered = {h.title for h in chunks_search(tenant=a, query=query, top_k=20)}
    by_department = {title: department for title, department, _ in DOCUMENTS} | {"Old VPN notes": "it"}
    it = chunks_search(tenant=a, query=query, filters={"department": "it"}, top_k=20)
    assert {h.title for h in it} == {t for t in unfiltered if by_department[t] == "it"}
    assert {h.metadata["department"] for h in it} == {"it"}
    any_of = chunks_search(tenant=a, query=query, filters={"department": ["hr", "finance"]}, top_k=20)
    assert {h.title for h in any_of} == {t for t in unfiltered if by_department[t] in {"hr", "finance"}}
    assert {h.metadata["department"] for h in any_of} == {"hr", "finance"}
    both_keys = chunks_search(tenant=a, query=query, filters={"department": ["it"], "visibility": "internal"},
                              top_k=20)
    assert {h.title for h in both_keys} == {h.title for h in it} - {"Old VPN notes"}  # it has no visibility
    assert chunks_search(tenant=a, query=query, filters={"department": []}) == []
    assert chunks_search(tenant=a, query=query, filters={"department": [], "visibility": "internal"}) == []
    assert chunks_search(tenant=a, query=query, filters={"department": "nobody"}) == []


@pytest.mark.django_db
def test_a_hit_carries_the_best_chunk_of_its_document(kb):
    a = kb.world.a.tenant
    filler = "Routine operations text about servers and rotas. " * 20
    paragraphs = [filler + f"Section {i}." for i in range(5)]
    paragraphs[3] = "The zanzibar gateway is configured first. " + filler + " Finally the zanzibar gateway restarts."
    outcome = document_ingest(tenant=a, dataset=kb.handbook, title="Operations notes", text="\n\n".join(paragraphs),
                              metadata={"department": "ops", "level": 2})
    document = outcome.document
    assert document.chunk_count == 5
    chunk = Chunk.objects.for_tenant(a).get(document=document, ordinal=3)
    [hit] = chunks_search(tenant=a, query="zanzibar gateway")
    assert (hit.document_id, hit.chunk_id, hit.ordinal) == (document.pk, chunk.pk, 3)
    assert (hit.dataset, hit.title, hit.metadata, hit.rank) == ("handbook", "Operations notes",
                                                                 {"department": "ops", "level": 2}, 1)
    assert isinstance(hit.score, float) and hit.score > 0
    assert f"{HL_START}zanzibar{HL_STOP} {HL_START}gateway{HL_STOP}" in hit.snippet_marked
    if connection.vendor == "postgresql":
        assert " … " in hit.snippet_marked  # two fragments: the start and the end of the chunk
    assert "**zanzibar** **gateway**" in hit.snippet
    assert len(hit.snippet_marked.split()) < len(chunk.text.split())


# --- search: which words select, and the candidate cap -----------------------------------------

def bulk_chunks(tenant, name: str, texts: list[str]) -> list[Chunk]:
    """One document of many chunks, inserted in this order (the order candidates are found in)."""
    dataset = dataset_create(tenant=tenant, name=name)
    document = Document.objects.create(tenant=tenant, dataset=dataset, external_id=name, title=name, text="",
                                       content_hash=name, chunk_count=len(texts))
    return Chunk.objects.bulk_create([
        Chunk(tenant=tenant, document=document, dataset=dataset, ordinal=i, title=name, text=text, metadata={})
        for i, text in enumerate(texts)])


@pytest.mark.django_db
def test_rare_words_rank_every_chunk_holding_them(world):
    a = world.a.tenant
    half = CANDIDATE_CAP - 100
    chunks = bulk_chunks(a, "rare", ["alpha note"] * half + ["beta note"] * half + ["alpha beta, alpha beta."])
    # both words are rare (at most CANDIDATE_CAP chunks each), so all their chunks are candidates, even the last
    [hit] = chunks_search(tenant=a, query="alpha beta")
    assert hit.chunk_id == chunks[-1].pk


@pytest.mark.django_db
def test_common_words_rank_only_the_first_candidates_found(world):
    a = world.a.tenant
    weak = "gamma " + "filler words " * 15 + "delta"
    chunks = bulk_chunks(a, "common", [weak] * (CANDIDATE_CAP + 100) + ["gamma delta gamma delta gamma delta"])
    [hit] = chunks_search(tenant=a, query="gamma delta")
    # The cap: only the first CANDIDATE_CAP chunks found (in the table's physical order) are ranked, so the best
    # chunk, when stored after them, is never ranked.
    with connection.cursor() as cursor:
        order = "ctid" if connection.vendor == "postgresql" else "id"
        cursor.execute(f"SELECT id FROM knowledge_chunk WHERE document_id = %s ORDER BY {order}",  # noqa: S608
                       [chunks[0].document_id])
        found_first = [row[0] for row in cursor.fetchall()][:CANDIDATE_CAP]
    assert hit.chunk_id in found_first
    assert (hit.chunk_id == chunks[-1].pk) is (chunks[-1].pk in found_first)
    # A word PostgreSQL's configuration drops (no lexeme) counts 0: the common word still selects.
    hits = chunks_search(tenant=a, query="gamma \u00b2")
    assert [h.document_id for h in hits] == [chunks[0].document_id]
    assert chunks_search(tenant=a, query="\u00b2") == []


# --- the SQLite statements, on an in-memory SQLite database (in a PostgreSQL run too) ------------

@pytest.fixture
def sqlite_db(django_db_blocker):
    sqlite = ConnectionHandler({"default": {"ENGINE": "django.db.backends.dummy"},
                                "sqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}})["sqlite"]
    with django_db_blocker.unblock():
        yield sqlite
        sqlite.close()


@pytest.fixture
def sqlite_cursor(sqlite_db):
    with sqlite_db.cursor() as cursor:
        yield cursor


METADATA = {1: {"v": 3}, 2: {"v": 3.0}, 3: {"v": "3"}, 4: {"v": True}, 5: {"v": 1}, 6: {"v": None}, 7: {},
            8: {"v": False}, 9: {"v": 0}, 10: {"v": "x"}, 11: {"a.b": 1}, 12: {"a": {"b": 1}}}


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("v", 3, {1, 2}), ("v", 3.0, {1, 2}), ("v", "3", {3}), ("v", True, {4}), ("v", False, {8}), ("v", 1, {5}),
    ("v", 0, {9}), ("v", None, {6}), ("v", "x", {10}), ("v", 2.5, set()), ("a.b", 1, {11}),
])
def test_sqlite_metadata_equality_is_typed_like_jsonb_containment(sqlite_cursor, key, value, expected):
    sqlite_cursor.execute("CREATE TABLE c (id integer PRIMARY KEY, metadata text)")
    sqlite_cursor.executemany("INSERT INTO c VALUES (%s, %s)", [(pk, json.dumps(m)) for pk, m in METADATA.items()])
    sql, params = selectors._sqlite_equals(key, value)
    sqlite_cursor.execute(f"SELECT id FROM c WHERE {sql}", params)  # noqa: S608
    assert {row[0] for row in sqlite_cursor.fetchall()} == expected


def test_sqlite_scope_keeps_the_tenant_its_datasets_and_the_filters(sqlite_cursor):
    sqlite_cursor.execute("CREATE TABLE c (id integer PRIMARY KEY, tenant_id int, dataset_id int, metadata text)")
    rows = [(1, 7, 1, {"d": "hr"}), (2, 7, 2, {"d": "it"}), (3, 7, 3, {"d": "hr"}), (4, 8, 1, {"d": "hr"}),
            (5, 7, 1, {"d": "hr", "n": 3}), (6, 7, 2, {"d": "finance"})]
    sqlite_cursor.executemany("INSERT INTO c VALUES (%s, %s, %s, %s)", [(*r[:3], json.dumps(r[3])) for r in rows])

    def found(dataset_ids, filters):
        scope, params = selectors._scope_sql(selectors._sqlite_equals, 7, dataset_ids, filters)
        sqlite_cursor.execute(f"SELECT id FROM c WHERE {scope}", params)  # noqa: S608
        return {row[0] for row in sqlite_cursor.fetchall()}

    assert found(None, {}) == {1, 2, 3, 5, 6}
    assert found([1, 2], {}) == {1, 2, 5, 6}
    assert found([1, 2], {"d": ["hr", "finance"]}) == {1, 5, 6}
    assert found(None, {"d": "hr", "n": 3}) == {5}
    assert found(None, {"d": []}) == set()


def test_sqlite_term_counts_stop_one_past_the_cap(sqlite_cursor):
    sqlite_cursor.execute("CREATE VIRTUAL TABLE fts_counts USING fts5(title, text)")
    rows = [("t", "common")] * (CANDIDATE_CAP + 10) + [("t", "edge")] * CANDIDATE_CAP + [("t", "rare word")] * 3
    sqlite_cursor.executemany("INSERT INTO fts_counts(title, text) VALUES (%s, %s)", rows)
    assert selectors._sqlite_term_counts(sqlite_cursor, "fts_counts", ["common", "edge", "rare", "absent"]) == [
        CANDIDATE_CAP + 1, CANDIDATE_CAP, 3, 0]
    assert selectors._sqlite_term_counts(sqlite_cursor, "fts_counts", ["word"]) == [3]


@pytest.fixture
def sqlite_knowledge(sqlite_db, monkeypatch):
    """Knowledge's tables on the in-memory SQLite database, which chunks_search(using="sqlite") searches, with
    tenant 7's datasets 1 (`handbook`) and 2 (`archive`), and tenant 8's dataset 3 (`handbook`)."""
    with sqlite_db.schema_editor(atomic=False) as editor:
        for model in (Dataset, Document, Chunk):
            editor.create_model(model)
    sqlite_db.disable_constraint_checking()  # no tenant or document rows: the search reads neither
    with sqlite_db.cursor() as cursor:
        cursor.executemany("INSERT INTO knowledge_dataset (id, tenant_id, name, description, created_at, updated_at)"
                           " VALUES (%s, %s, %s, '', '2026-01-01', '2026-01-01')",
                           [(1, 7, "handbook"), (2, 7, "archive"), (3, 8, "handbook")])
        for tenant_id in (7, 8):
            fts.sqlite_tenant_index(cursor, tenant_id)
    monkeypatch.setattr(selectors, "connections", {"sqlite": sqlite_db})
    return SimpleNamespace(db=sqlite_db, next_id=iter(range(100, 100_000)))


def sqlite_document(knowledge, tenant_id, dataset_id, title, texts, metadata=None) -> tuple[int, list[int]]:
    """A document's chunks (one per text, ordinals from 0), inserted in order: (document id, chunk ids)."""
    document_id = next(knowledge.next_id)
    ids = [next(knowledge.next_id) for _ in texts]
    with knowledge.db.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO knowledge_chunk (id, tenant_id, document_id, dataset_id, ordinal, title, text, metadata)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [(pk, tenant_id, document_id, dataset_id, ordinal, title, text, json.dumps(metadata or {}))
             for ordinal, (pk, text) in enumerate(zip(ids, texts, strict=True))])
    return document_id, ids


def sqlite_search(query, tenant_id=7, dataset_ids=None, filters=None, top_k=5):
    return selectors._search_sqlite(selectors.connections["sqlite"], tenant_id, clean_query(query), dataset_ids,
                                    clean_filters(filters), top_k)


def test_sqlite_search_returns_the_best_chunk_of_each_document_with_its_fields(sqlite_knowledge):
    filler = "routine servers rota " * 10
    document, chunks = sqlite_document(sqlite_knowledge, 7, 1, "Operations notes",
                                       [filler, filler + "zanzibar gateway", "zanzibar gateway zanzibar", filler],
                                       {"department": "ops", "level": 2})
    other, [other_chunk] = sqlite_document(sqlite_knowledge, 7, 2, "Gateway", ["gateway only"])
    hits = chunks_search(tenant=7, query="zanzibar gateway", using="sqlite")
    assert [(h.document_id, h.chunk_id, h.ordinal, h.rank) for h in hits] == [(document, chunks[2], 2, 1),
                                                                               (other, other_chunk, 0, 2)]
    best = hits[0]
    assert (best.dataset, best.title, best.metadata) == ("handbook", "Operations notes",
                                                         {"department": "ops", "level": 2})
    assert (hits[1].dataset, hits[1].title, hits[1].metadata) == ("archive", "Gateway", {})
    assert isinstance(best.score, float) and best.score > hits[1].score > 0
    assert best.snippet_marked == f"{HL_START}zanzibar{HL_STOP} {HL_START}gateway{HL_STOP} {HL_START}zanzibar{HL_STOP}"
    assert hits[1].snippet == "**gateway** only"
    assert [h.chunk_id for h in chunks_search(tenant=7, query="zanzibar gateway", top_k=1, using="sqlite")] == [
        chunks[2]]


def test_sqlite_search_keeps_to_the_tenant_its_datasets_and_the_filters(sqlite_knowledge):
    handbook, _ = sqlite_document(sqlite_knowledge, 7, 1, "VPN guide", ["vpn laptop"], {"department": "it"})
    archive, _ = sqlite_document(sqlite_knowledge, 7, 2, "Old notes", ["legacy vpn"], {"department": "hr"})
    sqlite_document(sqlite_knowledge, 8, 3, "VPN VPN", ["vpn vpn vpn laptop vpn"], {"department": "it"})

    def documents(**scope):
        return sorted(h.document_id for h in sqlite_search("vpn laptop", **scope))

    assert documents() == sorted([handbook, archive])
    assert documents(dataset_ids=[2]) == [archive]
    assert documents(dataset_ids=[1, 2]) == sorted([handbook, archive])
    assert documents(dataset_ids=[3]) == []  # tenant 8's dataset: the tenant is still enforced
    assert documents(filters={"department": "it"}) == [handbook]
    assert documents(filters={"department": ["hr", "it"]}) == sorted([handbook, archive])
    assert documents(filters={"department": []}) == []
    assert documents(tenant_id=9) == []  # nothing ever indexed for this tenant
    assert sqlite_search("absent words") == []


def test_sqlite_search_ranks_every_chunk_of_the_rare_words(sqlite_knowledge):
    half = CANDIDATE_CAP - 100
    document, chunks = sqlite_document(sqlite_knowledge, 7, 1, "rare",
                                       ["alpha note"] * half + ["beta note"] * half + ["alpha beta, alpha beta."])
    [hit] = sqlite_search("alpha beta")
    assert hit.chunk_id == chunks[-1]


def test_sqlite_search_ranks_only_the_first_candidates_of_common_words(sqlite_knowledge):
    weak = "gamma " + "filler words " * 15 + "delta"
    document, chunks = sqlite_document(sqlite_knowledge, 7, 1, "common",
                                       [weak] * (CANDIDATE_CAP + 100) + ["gamma delta gamma delta gamma delta"])
    [hit] = sqlite_search("gamma delta")
    assert hit.chunk_id in chunks[:CANDIDATE_CAP]
