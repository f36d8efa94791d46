import threading
from types import SimpleNamespace

import pytest

from knowledge.models import Dataset
from knowledge.services import TOOL_NAME, dataset_create, documents_ingest_bulk
from tests.knowledge.corpus import DOCUMENTS
from tools.catalog.selectors import bindings_for
from tools.models import Tool
from tools.python.decorators import ToolContext, python_tool

B_SECRET = "GLOBEX-SECRET-4411"


def ingest_corpus(tenant, dataset):
    documents = [{"title": title, "text": text, "metadata": {"department": department, "visibility": "internal"}}
                 for title, department, text in DOCUMENTS]
    return documents_ingest_bulk(tenant=tenant, dataset=dataset, documents=documents)


@pytest.fixture
def kb(world):
    """Tenant A: the corpus in `handbook`, one more doc in `archive`. Tenant B: a dataset with the same
    name, holding a document that matches VPN queries better than anything in A."""
    a, b = world.a, world.b
    handbook = dataset_create(tenant=a.tenant, name="handbook", description="Company handbook")
    ingest_corpus(a.tenant, handbook)
    archive = dataset_create(tenant=a.tenant, name="archive")
    documents_ingest_bulk(tenant=a.tenant, dataset=archive, documents=[
        {"title": "Old VPN notes", "text": "The legacy VPN used OpenVPN. VPN VPN VPN.",
         "metadata": {"department": "it"}}])
    b_handbook = dataset_create(tenant=b.tenant, name="handbook")
    documents_ingest_bulk(tenant=b.tenant, dataset=b_handbook, documents=[
        {"title": "VPN Setup Guide", "text": f"VPN laptop WireGuard VPN setup {B_SECRET}. VPN VPN VPN.",
         "metadata": {"department": "hr"}}])
    return SimpleNamespace(world=world, handbook=handbook, archive=archive, b_handbook=b_handbook)


@pytest.fixture
def threads_share_the_database(db):
    """Calls that really run use executor threads, each with its own connection. Django's default SQLite
    test database (in-memory, shared cache) locks whole tables across connections, so those tests need
    PostgreSQL or a file database: TEST_DATABASE_URL=sqlite:///… with --ds tests.knowledge.sqlite_settings."""
    from django.db import connection

    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        pytest.skip("in-memory SQLite test database: use --ds tests.knowledge.sqlite_settings")


def search_tool(tenant) -> Tool:
    return Tool.objects.for_tenant(tenant).get(name=TOOL_NAME)


def run_tool(tenant, arguments: dict, agent: str = "support-bot"):
    """Run knowledge_search as the executor would: the model's input, the agent's bindings merged last."""
    tool = search_tool(tenant)
    bound = bindings_for(tenant, agent, [tool.pk]).get(tool.pk, {})
    call = SimpleNamespace(input=dict(arguments), call_id="call_test")
    session = SimpleNamespace(agent=agent, user="")
    ctx = ToolContext(tenant=tenant, session=session, call=call, emit=lambda *a, **k: None,
                      cancelled=threading.Event())
    return python_tool(TOOL_NAME)({**arguments, **bound}, ctx)


def dataset_named(tenant, name) -> Dataset:
    return Dataset.objects.for_tenant(tenant).get(name=name)
