"""The search service and the tool, called directly (the executor's view of a call)."""
import pytest
from django.db import connection

from knowledge import fts
from knowledge.models import Chunk, Document
from knowledge.selectors import InvalidQuery, chunks_search
from knowledge.services import document_ingest
from tests.knowledge.conftest import B_SECRET, run_tool, search_tool
from tests.knowledge.corpus import DOCUMENTS, RANKING
from tools.catalog.services import binding_delete, binding_set
from tools.python.decorators import ToolError

pytestmark = pytest.mark.django_db


def titles(result):
    return [r["title"] for r in result["results"]]


def test_fulltext_index_of_the_database_in_use(kb):
    a, b = kb.world.a.tenant, kb.world.b.tenant
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            # A table per tenant: each holds that tenant's chunks only.
            counts = {}
            for tenant in (a, b):
                table = fts.sqlite_table(tenant.pk)
                cursor.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH 'wireguard'")  # noqa: S608
                counts[tenant.pk] = {row[0] for row in cursor.fetchall()}
            for tenant in (a, b):
                own = set(Chunk.objects.for_tenant(tenant).values_list("pk", flat=True))
                assert counts[tenant.pk] and counts[tenant.pk] <= own
        else:
            cursor.execute("SELECT count(*) FROM knowledge_chunk WHERE search @@ to_tsquery('english', 'wireguard')")
            assert cursor.fetchone()[0] >= 2  # A's guide and B's document: one index, ranked per row


@pytest.mark.parametrize(("query", "expected"), RANKING)
def test_the_relevant_document_comes_first(kb, query, expected):
    hits = chunks_search(tenant=kb.world.a.tenant, query=query, datasets=["handbook"], top_k=3)
    assert hits, f"nothing found for {query!r}"
    assert hits[0].title == expected, f"{query!r}: got {[h.title for h in hits]}"


def test_ranking_covers_a_dozen_queries_over_the_whole_corpus():
    assert len(RANKING) >= 12
    assert {expected for _, expected in RANKING} <= {title for title, _, _ in DOCUMENTS}


def test_results_carry_title_snippet_score_and_document_id(kb):
    result = run_tool(kb.world.a.tenant, {"query": "WireGuard VPN profile", "top_k": 3})
    first = result["results"][0]
    assert set(first) == {"rank", "document_id", "title", "dataset", "snippet", "score"}
    document = Document.objects.for_tenant(kb.world.a.tenant).get(pk=first["document_id"])
    assert document.title == first["title"] == "VPN Setup Guide"
    assert first["dataset"] == "handbook"
    assert "**WireGuard**" in first["snippet"]
    scores = [r["score"] for r in result["results"]]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0
    assert [r["rank"] for r in result["results"]] == list(range(1, len(scores) + 1))


def test_one_result_per_document(kb):
    long_text = "\n\n".join(f"Paragraph {i} about the quarterly budget planning and forecast." * 8 for i in range(12))
    document_ingest(tenant=kb.world.a.tenant, dataset=kb.handbook, title="Budget planning", text=long_text)
    hits = chunks_search(tenant=kb.world.a.tenant, query="quarterly budget forecast", top_k=5)
    ids = [h.document_id for h in hits]
    assert len(ids) == len(set(ids))
    assert Document.objects.for_tenant(kb.world.a.tenant).get(title="Budget planning").chunk_count > 1


def test_default_scope_is_every_dataset_of_the_tenant_and_no_filter(kb):
    result = run_tool(kb.world.a.tenant, {"query": "legacy OpenVPN", "top_k": 5})
    assert titles(result)[0] == "Old VPN notes"
    assert {r["dataset"] for r in run_tool(kb.world.a.tenant, {"query": "VPN", "top_k": 10})["results"]} == {
        "handbook", "archive"}


def test_tenant_b_documents_never_appear_for_tenant_a(kb):
    a = kb.world.a.tenant
    for datasets in ("*", ["handbook"], ["handbook", "archive"]):
        hits = chunks_search(tenant=a, query=f"VPN setup {B_SECRET}", datasets=datasets, top_k=20)
        assert hits
        b_ids = set(Document.objects.for_tenant(kb.world.b.tenant).values_list("pk", flat=True))
        assert not {h.document_id for h in hits} & b_ids
        assert all(B_SECRET.lower() not in h.snippet.lower() for h in hits)
    # and the other way round: B sees only its own document, even for A's best-matching words
    hits = chunks_search(tenant=kb.world.b.tenant, query="vacation days WireGuard", top_k=20)
    assert [h.title for h in hits] == ["VPN Setup Guide"]
    assert B_SECRET in Chunk.objects.for_tenant(kb.world.b.tenant).get(document_id=hits[0].document_id).text


def test_an_agent_bound_to_one_department_never_sees_another(kb):
    a = kb.world.a
    tool = search_tool(a.tenant)
    binding_set(tenant=a.tenant, tool=tool, name="filter", value={"department": "hr"}, agent="hr-bot")
    # The IT guide is the best match for this query, for everyone else.
    assert titles(run_tool(a.tenant, {"query": "VPN tunnel on my laptop"}))[0] == "VPN Setup Guide"
    result = run_tool(a.tenant, {"query": "VPN tunnel on my laptop", "top_k": 20}, agent="hr-bot")
    assert result["results"], "the HR onboarding page mentions VPN access"
    departments = {Document.objects.for_tenant(a.tenant).get(pk=r["document_id"]).metadata["department"]
                   for r in result["results"]}
    assert departments == {"hr"}
    assert titles(result)[0] == "New Hire Onboarding"
    # Nothing in hr matches these words at all: nothing comes back, rather than another department.
    assert run_tool(a.tenant, {"query": "WireGuard PagerDuty rollback"}, agent="hr-bot")["results"] == []


def test_bound_datasets_limit_the_search(kb):
    a = kb.world.a
    binding_set(tenant=a.tenant, tool=search_tool(a.tenant), name="datasets", value=["archive"], agent="archivist")
    assert titles(run_tool(a.tenant, {"query": "VPN laptop WireGuard", "top_k": 10}, agent="archivist")) == [
        "Old VPN notes"]
    binding_set(tenant=a.tenant, tool=search_tool(a.tenant), name="datasets", value=["no-such"], agent="lost")
    assert run_tool(a.tenant, {"query": "VPN"}, agent="lost")["results"] == []


def test_filters_any_of_and_types(kb):
    a = kb.world.a.tenant
    hits = chunks_search(tenant=a, query="policy leave expense travel", filters={"department": ["hr", "finance"]},
                         top_k=20)
    assert hits and {h.metadata["department"] for h in hits} <= {"hr", "finance"}
    document_ingest(tenant=a, dataset=kb.handbook, title="Typed", text="zebra crossing",
                    metadata={"level": 3, "public": True, "owner": None})
    for filters, found in (({"level": 3}, True), ({"level": "3"}, False), ({"public": True}, True),
                           ({"public": 1}, False), ({"owner": None}, True), ({"level": []}, False)):
        assert bool(chunks_search(tenant=a, query="zebra", filters=filters)) is found, filters


@pytest.mark.parametrize(("query", "message"), [
    ("", "empty"), ("   ", "empty"), ("x" * 501, "limit is 500"), ("the and of", "no searchable words"),
])
def test_empty_or_overlong_query_is_a_clear_tool_error(kb, query, message):
    with pytest.raises(ToolError) as raised:
        run_tool(kb.world.a.tenant, {"query": query})
    assert raised.value.error_type == "InvalidQuery"
    assert message in str(raised.value)


def test_query_syntax_is_never_interpreted(kb):
    for query in ('"unbalanced', "NEAR(vpn laptop)", "vpn* OR title:secret", "a:b | !c & (d", "'; DROP TABLE x; --"):
        run_tool(kb.world.a.tenant, {"query": query})  # no error from the database


def test_model_supplied_scope_is_refused_even_without_a_binding(kb):
    a = kb.world.a.tenant
    tool = search_tool(a)
    for binding in tool.bindings.filter(agent=""):
        binding_delete(binding=binding)
    for extra in ({"filter": {"department": "it"}}, {"datasets": ["archive"]}):
        with pytest.raises(ToolError) as raised:
            run_tool(a, {"query": "vpn", **extra})
        assert raised.value.error_type == "BoundArgumentOverride"
    assert run_tool(a, {"query": "legacy OpenVPN"})["results"]  # the safe default still applies


def test_invalid_bound_filter_is_reported_not_ignored(kb):
    a = kb.world.a.tenant
    binding_set(tenant=a, tool=search_tool(a), name="filter", value={"bad\"key": "x"}, agent="broken")
    with pytest.raises(ToolError):
        run_tool(a, {"query": "vpn"}, agent="broken")
    with pytest.raises(InvalidQuery):
        chunks_search(tenant=a, query="vpn", filters={"k": {"nested": 1}})
