"""List pages cost a fixed number of queries, however many rows they show (DESIGN §12)."""
import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tools.models import Tool
from tools.services import calls_submit, group_create, session_create

pytestmark = pytest.mark.django_db

PAGES = ["/t/acme/", "/t/acme/tools/", "/t/acme/groups/", "/t/acme/bindings/", "/t/acme/keys/",
         "/t/acme/sessions/", "/t/acme/calls/"]


def _queries(client, url) -> int:
    cache.clear()  # each page as on its first view: what pages cache (the dashboard's audit check) is made again
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured.captured_queries)


def _grow(world, n):
    tenant = world.a.tenant
    for _ in range(n):
        number = Tool.objects.for_tenant(tenant).count()
        tool = Tool.objects.create(tenant=tenant, name=f"extra_{number}", source="external",
                                   input_schema={"type": "object", "properties": {}})
        group_create(tenant=tenant, name=f"g-{tool.pk}", tools=[tool])
        session = session_create(tenant=tenant, agent=f"bot-{tool.pk}")
        calls_submit(session=session, calls=[{"name": "no_such_tool", "input": {}}])


def test_list_pages_do_not_query_per_row(world):
    client = world.a.console("operator")
    _grow(world, 1)
    before = {url: _queries(client, url) for url in PAGES}
    _grow(world, 5)
    after = {url: _queries(client, url) for url in PAGES}
    assert after == before
