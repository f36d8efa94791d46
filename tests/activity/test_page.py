"""The activity page (docs/observability.md, "The activity page"): every member sees it, its charts carry
their numbers as text, what a tenant or an app named is escaped, and it costs the same queries whatever the data."""
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.activity.support import calls_make, http_tool, mcp_tool, queue_make, request_make
from tools.models import CallStatus

pytestmark = pytest.mark.django_db


def _page(client, query: str = "") -> str:
    response = client.get(f"/t/acme/activity/{query}")
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.parametrize("role", ["admin", "operator", "reviewer", "viewer"])
def test_every_member_sees_the_page_and_its_navigation_entry(world, role):
    page = _page(world.a.console(role))
    assert re.search(r'<a href="/t/acme/activity/"\s+class="on">Activity</a>', page)
    assert 'data-live-stream="/ws/console/acme/calls/"' in page  # follows the tenant's calls
    assert 'data-live-region="activity"' in page


def test_charts_have_names_descriptions_and_tables(world):
    tenant, now = world.a.tenant, timezone.now()
    tool, server = mcp_tool(tenant, "files", "read"), http_tool(tenant, "weather")
    calls = calls_make(tenant, [{"at": now - timedelta(minutes=4), "tool": tool, "took": 2},
                                {"at": now - timedelta(minutes=4), "tool": server, "status": CallStatus.FAILED,
                                 "took": 1},
                                {"at": now - timedelta(minutes=4), "tool": tool, "took": 3}])
    request_make(tenant, calls[2], queue=queue_make(tenant, "night"), opened=now - timedelta(minutes=4), waited=90)
    page = _page(world.a.console("viewer"))
    for chart in ("calls", "latency", "approvals", "tools", "upstream"):
        assert re.search(rf'<svg class="chart" id="chart-{chart}" role="img" '
                         rf'aria-labelledby="chart-{chart}-title chart-{chart}-desc"', page), chart
    assert '<figure class="wide" data-chart="calls" data-total="5">' in page  # the world's two calls and these
    # the world's reset_tools, the read and the weather call (the other read waited for a reviewer)
    assert "3 calls ran without waiting for a person; the slowest p95 was 2 s" in page
    assert "<td>night</td><td>1</td><td>1 min 30 s</td><td>1 min 30 s</td><td>0</td>" in page
    assert "<td>weather</td><td>http</td><td>1</td><td>1</td><td>100 %</td>" in page
    assert "1 failed of 3 calls to 2 upstream servers." in page


def test_names_from_tenants_and_apps_are_escaped(world):
    now = timezone.now()
    calls_make(world.a.tenant, [{"at": now, "name": '<script>alert("x")</script>', "status": CallStatus.FAILED,
                                 "ran": False, "took": 0}])
    page = _page(world.a.console("viewer"))
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page  # in the chart and in its table


def test_the_span_switches_between_the_hour_and_the_day(world):
    now = timezone.now()
    calls_make(world.a.tenant, [{"at": now - timedelta(hours=5), "name": "earlier", "took": 1}])
    client = world.a.console("viewer")
    hour, day = _page(client), _page(client, "?span=day")
    assert '<a href="?span=hour" aria-current="page">Last hour</a>' in hour
    assert '<a href="?span=day" aria-current="page">Last day</a>' in day
    assert "<td>earlier</td>" not in hour and "<td>earlier</td>" in day
    assert hour.count("<rect ") < day.count("<rect ") or "earlier" in day
    assert _page(client, "?span=<x>").count('aria-current="page">Last hour') == 1  # anything else: the hour


def _queries(client) -> int:
    with CaptureQueriesContext(connection) as captured:
        _page(client)
    return len(captured.captured_queries)


def test_the_page_costs_the_same_queries_whatever_the_data(world):
    client = world.a.console("operator")
    _page(client)  # the session's first request loads what later ones find cached
    before = _queries(client)
    now, tenant = timezone.now(), world.a.tenant
    for n in range(3):
        tools = [mcp_tool(tenant, f"srv{n}", "read"), http_tool(tenant, f"hook{n}")]
        queue = queue_make(tenant, f"queue-{n}")
        calls = calls_make(tenant, [{"at": now - timedelta(minutes=i % 50), "tool": tools[i % 2],
                                     "status": CallStatus.FAILED if i % 4 == 0 else CallStatus.SUCCEEDED,
                                     "took": i / 10} for i in range(60)])
        for call in calls[:5]:
            request_make(tenant, call, queue=queue, opened=now - timedelta(minutes=1), waited=10)
    assert _queries(client) == before
