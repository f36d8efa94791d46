"""On PostgreSQL, over a table of many calls of several tenants, each of the activity page's queries reaches
the calls through the `(tenant, created_at)` index and the approval requests through `(tenant, status,
opened_at)`: never a scan of the whole table (docs/observability.md, "The activity page")."""
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F, OuterRef, Subquery
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ApprovalRequest, RequestStatus
from console.activity.selectors import SPANS, activity_of
from tests.activity.support import calls_make, http_tool, mcp_tool, queue_make
from tools.models import CallStatus, ToolCall

pytestmark = pytest.mark.django_db

CALLS_INDEX = "tools_toolc_tenant__7f26ba_idx"  # ToolCall's Index(fields=["tenant", "-created_at"])
DAYS = 30
CALLS_EACH = 6000  # per tenant, over DAYS days
STATUSES = [CallStatus.SUCCEEDED, CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.AWAITING_APPROVAL]


def _fill(tenant, now):
    tools = [mcp_tool(tenant, "files", "read"), http_tool(tenant, "weather")]
    queues = [queue_make(tenant, "day"), queue_make(tenant, "night")]
    step = DAYS * 86400 / CALLS_EACH
    calls = calls_make(tenant, [{"at": now - timedelta(seconds=i * step), "tool": tools[i % 2],
                                 "status": STATUSES[i % 4], "took": i % 11} for i in range(CALLS_EACH)])
    # A request of every other call: those of the last day still pending when their call waits, the rest
    # decided 9 s after they opened, with their call.
    recent = now - timedelta(days=1)
    ApprovalRequest.objects.bulk_create(ApprovalRequest(
        tenant=tenant, call=call, queue=queues[i % 2], tool_name=call.tool_name,
        status=RequestStatus.PENDING if call.status == CallStatus.AWAITING_APPROVAL and call.dispatched_at > recent
        else RequestStatus.APPROVED) for i, call in enumerate(calls) if i % 4 in (0, 3))
    requests = ApprovalRequest.objects.for_tenant(tenant)
    requests.update(opened_at=Subquery(ToolCall.objects.filter(pk=OuterRef("call_id")).values("created_at")[:1]))
    requests.exclude(status=RequestStatus.PENDING).update(decided_at=F("opened_at") + timedelta(seconds=9))


@pytest.fixture
def many_calls(world):
    if connection.vendor != "postgresql":
        pytest.skip("the plans checked are PostgreSQL's")
    now = timezone.now()
    for tenant in (world.a.tenant, world.b.tenant):
        _fill(tenant, now)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tools_toolcall")
        cursor.execute("ANALYZE approvals_approvalrequest")
    return world


@pytest.mark.parametrize("span", ["hour", "day"])
def test_every_query_goes_through_the_indexes(many_calls, span):
    with CaptureQueriesContext(connection) as captured:
        activity = activity_of(tenant=many_calls.a.tenant, span=SPANS[span])
    assert activity.total_calls > 0
    assert len(captured.captured_queries) == 6
    plans = []
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            cursor.execute(f"EXPLAIN {query['sql']}")
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    for query, plan in zip(captured.captured_queries, plans, strict=True):
        assert "Seq Scan on tools_toolcall" not in plan, (query["sql"], plan)
        assert "Seq Scan on approvals_approvalrequest" not in plan, (query["sql"], plan)
    calls_plans = [plan for query, plan in zip(captured.captured_queries, plans, strict=True)
                   if 'FROM "tools_toolcall"' in query["sql"]]
    assert len(calls_plans) == 4
    assert all(CALLS_INDEX in plan for plan in calls_plans), calls_plans
    requests_plans = [plan for plan in plans if plan not in calls_plans]
    assert all("approvals_a_tenant__bab1a5_idx" in plan for plan in requests_plans), requests_plans
