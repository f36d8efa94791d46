"""The suite's PostgreSQL backend (tests.pg_backend) flushes by deleting rows: after it every table is as empty as
after Django's TRUNCATE, the search statistics that triggers keep included."""
import pytest
from django.core.management import call_command
from django.db import connection

from knowledge.services import dataset_create
from tests.knowledge.conftest import ingest_corpus

pytestmark = pytest.mark.django_db(transaction=True)


def _count(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")  # noqa: S608 (the catalog's names)
        return cursor.fetchone()[0]


def test_the_flush_empties_every_table_and_what_their_triggers_keep(world):
    if connection.vendor != "postgresql":
        pytest.skip("the backend is the suite's on PostgreSQL only")
    ingest_corpus(world.a.tenant, dataset_create(tenant=world.a.tenant, name="flushed"))
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    filled = [table for table in tables if _count(table)]
    assert len(filled) >= 20 and "knowledge_chunk" in filled and "audit_event" in filled, filled
    assert _count("knowledge_lexeme") > 0

    # As a committing test ends (django.test.TransactionTestCase._fixture_teardown).
    call_command("flush", verbosity=0, interactive=False, inhibit_post_migrate=True, reset_sequences=False)

    assert {table: _count(table) for table in [*tables, "knowledge_lexeme"] if _count(table)} == {}
