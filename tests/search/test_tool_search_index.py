"""The tool search's full-text index on each database (docs/governance.md#tool-search): PostgreSQL's generated
tsvector (migration 0015), SQLite's FTS5 table kept by triggers (migration 0016). The index follows every write
of a tool, never fails one, weights the name over the description over the schema, and no query reaches the
engine as syntax. Runs on both databases (test_both_backends)."""
import importlib

import pytest
from django.db import connection

from tools.catalog.search import sqlite_statement_sql, tools_search
from tools.catalog.services import group_create, session_create, tool_external_create, tool_update
from tools.models import Tool, ToolSource

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_rule_index")]

MIGRATION = importlib.import_module("tools.migrations.0016_tool_search_sqlite")


def external(tenant, name: str, description: str, schema: dict | None = None) -> Tool:
    return tool_external_create(tenant=tenant, name=name, description=description,
                                input_schema=schema or {"type": "object", "properties": {}})


def raw(tenant, name: str, description: str, schema) -> Tool:
    """A tool written as a sync could write it, whatever its schema holds."""
    return Tool.objects.create(tenant=tenant, name=name, description=description, input_schema=schema,
                               source=ToolSource.EXTERNAL, source_ref=name)


def reachable(tenant, *tools: Tool) -> None:
    group_create(tenant=tenant, name=f"g{tools[0].pk}", switchable=False, default_active=True, tools=list(tools))


def found(tenant, query: str, limit: int = 25) -> list[str]:
    session = session_create(tenant=tenant, agent="search-bot")
    return [hit.name for hit in tools_search(session=session, query=query, limit=limit)]


@pytest.fixture
def tenant(world):
    tenant = world.a.tenant
    tools = [
        external(tenant, "invoice_send", "Email an invoice to a customer as a PDF attachment."),
        external(tenant, "falcon_report", "Summarise the quarter's figures."),
        external(tenant, "ledger_close", "Close the books; the falcon audit runs later."),
        external(tenant, "archive_move", "Move records to cold storage.", {"type": "object", "properties": {
            "target": {"type": "string", "description": "Where the falcon archive goes."}}}),
    ]
    reachable(tenant, *tools)
    return tenant


@pytest.mark.parametrize("query", [
    'invoice "', 'invoice"', '"invoice', 'invoice*', '* invoice', 'NEAR(invoice customer)', 'NEAR(invoice',
    'invoice AND', 'AND invoice', 'invoice OR', 'NOT invoice', 'invoice NOT customer', '-invoice', 'invoice -pdf',
    '^invoice', 'invoice:', 'name:invoice', 'description : invoice', '{name description}: invoice',
    'tenant : invoice', '(invoice', 'invoice)', 'invoice + pdf', 'invoice,pdf', "invoice's", 'invoice\x00',
    'invoice ünïcode 発票', 'invoice ⅷ ᐅ', 'invoice \u0301\u0301',
])
def test_full_text_syntax_in_a_query_is_plain_words_on_either_engine(tenant, query):
    assert "invoice_send" in found(tenant, query)


def test_a_query_word_cannot_search_the_tenant_column(tenant, world):
    if connection.vendor != "sqlite":
        pytest.skip("the FTS5 table's tenant column exists on SQLite only")
    assert found(tenant, f"t{tenant.pk}") == []
    assert found(tenant, f"tenant t{tenant.pk}") == found(tenant, "tenant")  # the word alone counts
    assert found(tenant, f"t{world.b.tenant.pk} invoice") == ["invoice_send"]


def test_every_word_first_then_any_word(tenant):
    # both hold "falcon"; only falcon_report holds "falcon" and "report" together
    assert found(tenant, "falcon report")[0] == "falcon_report"
    assert {"falcon_report", "ledger_close", "archive_move"} <= set(found(tenant, "falcon report"))


def test_the_name_weighs_more_than_the_description_more_than_the_schema(tenant):
    assert found(tenant, "falcon") == ["falcon_report", "ledger_close", "archive_move"]


def test_an_edited_description_is_found_by_its_new_words_and_not_its_old(tenant):
    tool = Tool.objects.for_tenant(tenant).get(name="invoice_send")
    assert found(tenant, "customer attachment") == ["invoice_send"]
    tool_update(tool=tool, description="Fax a quotation to a wholesaler.")
    assert found(tenant, "customer attachment") == []
    assert found(tenant, "quotation wholesaler") == ["invoice_send"]
    assert found(tenant, "invoice") == ["invoice_send"]  # its name still holds it


def test_a_renamed_resynced_or_deleted_tool_follows_in_the_index(tenant):
    tool = Tool.objects.for_tenant(tenant).get(name="archive_move")
    renamed = {"name": "vault_shift", "input_schema": {"properties": {"region_code": {}}}}
    Tool.objects.for_tenant(tenant).filter(pk=tool.pk).update(**renamed)
    assert found(tenant, "vault shift") == ["vault_shift"]
    assert found(tenant, "region code") == ["vault_shift"]
    assert found(tenant, "target") == [] and found(tenant, "archive") == []
    Tool.objects.for_tenant(tenant).filter(pk=tool.pk).delete()
    assert found(tenant, "vault shift region") == []


def test_schema_words_at_any_depth_are_found(tenant):
    deep = {"type": "object", "properties": {"outer": {"type": "object", "properties": {
        "middle": {"type": "array", "items": {"type": "object", "properties": {
            "innermost_field": {"type": "string", "description": "The heliotrope marker."}}}}}}}}
    reachable(tenant, raw(tenant, "deep_tool", "Nothing here.", deep))
    assert found(tenant, "heliotrope") == ["deep_tool"]
    assert found(tenant, "innermost field") == ["deep_tool"]


@pytest.mark.parametrize("schema", [
    {"properties": ["zircon"]}, {"properties": "zircon"}, {"properties": {"a": 1}, "description": 5},
    {"description": {"nested": "zircon"}}, {"properties": None}, [1, "zircon", {"properties": {}}], "zircon",
    5, {"": {"": {"": ""}}}, {"properties": {"x" * 5000: {"description": "d" * 200_000}}},
    {"a": [[[[[[{"properties": {"wolframite": {}}}]]]]]]},
])
def test_a_schema_of_any_shape_never_fails_a_write(tenant, schema):
    tool = raw(tenant, "odd_shape", "A gadget with an odd schema.", schema)
    reachable(tenant, tool)
    assert found(tenant, "odd shape gadget") == ["odd_shape"]
    tool.input_schema, tool.description = {"properties": {"sane": {}}}, "Now sane."
    tool.save()
    assert found(tenant, "sane") == ["odd_shape"]
    Tool.objects.for_tenant(tenant).filter(pk=tool.pk).update(input_schema=schema)
    assert found(tenant, "odd shape") == ["odd_shape"]


def test_a_deeply_nested_schema_never_fails_a_write(tenant):
    schema: dict = {"description": "the bottom"}
    for _ in range(200):
        schema = {"properties": {"p": schema}}
    reachable(tenant, raw(tenant, "deep_nest", "Nested deep.", schema))
    assert found(tenant, "nested deep") == ["deep_nest"]


def test_another_tenant_s_tools_never_reach_the_statement(tenant, world):
    other = raw(world.b.tenant, "falcon_secret", "The falcon ledger of the other tenant.", {})
    reachable(world.b.tenant, other)
    assert "falcon_secret" not in found(tenant, "falcon secret ledger")
    assert found(world.b.tenant, "falcon secret") == ["falcon_secret"]


def sqlite_objects() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE name LIKE 'tools_tool_fts%' AND type IN "
                       "('table', 'trigger')")
        return {row[0] for row in cursor.fetchall()}


def test_the_sqlite_migration_goes_back_and_forth_and_fills_existing_rows(tenant):
    if connection.vendor != "sqlite":
        pytest.skip("the FTS5 table exists on SQLite only")
    made = {"tools_tool_fts", "tools_tool_fts_ai", "tools_tool_fts_ad", "tools_tool_fts_au"}
    assert made <= sqlite_objects()
    with connection.cursor() as cursor:
        for statement in MIGRATION.SQLITE_UNINSTALL:
            cursor.execute(statement)
        assert sqlite_objects() == set()
        raw(tenant, "written_between", "Written during the quokka outage.", {})  # no trigger, no failure
        for statement in MIGRATION.SQLITE_INSTALL:
            cursor.execute(statement)
    assert made <= sqlite_objects()
    reachable(tenant, Tool.objects.for_tenant(tenant).get(name="written_between"))
    assert found(tenant, "quokka outage") == ["written_between"]
    assert found(tenant, "falcon")[0] == "falcon_report"


def test_the_sqlite_statement_walks_the_matches_not_the_tenant_s_tools(tenant):
    if connection.vendor != "sqlite":
        pytest.skip("the FTS5 table exists on SQLite only")
    for every in (True, False):
        sql, params = sqlite_statement_sql(tenant.pk, ["invoice", "customer"], every)
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", [*params, 10])
            steps = [row[-1] for row in cursor.fetchall() if row[-1].startswith(("SCAN", "SEARCH"))]
        assert steps[0].startswith("SCAN tools_tool_fts VIRTUAL TABLE"), steps
        assert steps[1].startswith("SEARCH t USING INTEGER PRIMARY KEY"), steps
