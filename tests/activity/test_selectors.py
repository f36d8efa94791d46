"""The activity page's numbers (docs/observability.md, "The activity page"): each chart's data, computed on
the database, for the tenant alone, in a fixed number of queries."""
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from console.activity.selectors import SPANS, activity_of
from tests.activity.support import calls_make, http_tool, mcp_tool, queue_make, request_make
from tools.models import CallStatus, Tool

pytestmark = pytest.mark.django_db


def _tool(tenant, name="lookup"):
    return Tool.objects.create(tenant=tenant, name=name, source="python", input_schema={"type": "object"})


def _bucket(span, now, at) -> int:
    return (int(at.timestamp()) - span.start(now)) // span.width


def test_calls_are_counted_in_the_bucket_they_arrived_by_their_status(quiet, world):
    now, span = timezone.now(), SPANS["hour"]
    tool = _tool(quiet)
    five, thirty, old = now - timedelta(minutes=5), now - timedelta(minutes=30), now - timedelta(minutes=61)
    calls_make(quiet, [{"at": five, "tool": tool, "took": 1}] * 3 + [
        {"at": five, "tool": tool, "status": CallStatus.FAILED, "took": 1},
        {"at": thirty, "tool": tool, "status": CallStatus.DENIED, "took": 0.01},
        {"at": thirty, "tool": tool, "status": CallStatus.AWAITING_APPROVAL},
        {"at": old, "tool": tool, "took": 1},  # before the span
    ])
    activity = activity_of(tenant=quiet, span=span, now=now)
    assert activity.by_status == {
        _bucket(span, now, five): {"succeeded": 3, "failed": 1},
        _bucket(span, now, thirty): {"denied": 1, "awaiting_approval": 1},
    }
    assert activity.total_calls == 6
    assert len(activity.starts) == 60 and activity.starts[-1] <= now < activity.starts[-1] + timedelta(minutes=1)

    # The day's span: the same calls in quarter hours, the old one too.
    day = activity_of(tenant=quiet, span=SPANS["day"], now=now)
    assert day.total_calls == 7
    assert sum(day.by_status[_bucket(SPANS["day"], now, five)].values()) >= 4


def test_another_tenants_calls_are_never_counted(quiet, world):
    now, span = timezone.now(), SPANS["hour"]
    mine = mcp_tool(quiet, "files", "read")
    theirs = mcp_tool(world.b.tenant, "files", "read")  # the same names in another tenant
    queue_mine, queue_theirs = queue_make(quiet, "ops"), queue_make(world.b.tenant, "ops")
    at = now - timedelta(minutes=3)
    (own,) = calls_make(quiet, [{"at": at, "tool": mine, "status": CallStatus.FAILED, "took": 2}])
    other = calls_make(world.b.tenant, [{"at": at, "tool": theirs, "status": CallStatus.FAILED, "took": 9}] * 4
                       + [{"at": at, "tool": theirs, "status": CallStatus.AWAITING_APPROVAL}] * 2)
    request_make(quiet, own, queue=queue_mine, opened=at, waited=5)
    request_make(world.b.tenant, other[0], queue=queue_theirs, opened=at, waited=50)
    request_make(world.b.tenant, other[4], queue=queue_theirs, opened=at)
    activity = activity_of(tenant=quiet, span=span, now=now)
    assert activity.total_calls == 1
    assert activity.top_tools == [{"name": "mcp__files__read", "calls": 1, "failed": 1}]
    assert activity.upstream == [{"kind": "mcp", "server": "files", "calls": 1, "failed": 1}]
    assert activity.approval_waits == [{"name": "ops", "decided": 1, 50: 5.0, 95: 5.0, "pending": 0,
                                        "oldest": None}]
    assert activity.latency == {}  # its one call waited for a person


def test_latency_percentiles_are_nearest_rank_per_bucket(quiet):
    now, span = timezone.now(), SPANS["hour"]
    tool = _tool(quiet)
    busy, lone = now - timedelta(minutes=10), now - timedelta(minutes=20)
    calls = calls_make(quiet, [{"at": busy, "tool": tool, "took": seconds} for seconds in range(20, 0, -1)] + [
        {"at": lone, "tool": tool, "took": 0.25},
        {"at": lone, "tool": tool, "status": CallStatus.FAILED, "took": 0.001, "ran": False},  # never ran
        {"at": lone, "tool": tool, "status": CallStatus.RUNNING},  # not finished
        {"at": lone, "tool": tool, "took": 500},  # waited for a reviewer: the approvals chart's
    ])
    request_make(quiet, calls[-1], queue=queue_make(quiet, "q"), opened=lone, waited=499)
    latency = activity_of(tenant=quiet, span=span, now=now).latency
    assert latency == {
        _bucket(span, now, busy): {"n": 20, 50: 10.0, 95: 19.0},
        _bucket(span, now, lone): {"n": 1, 50: 0.25, 95: 0.25},
    }


def test_approval_waits_per_queue_with_the_requests_waiting_now(quiet):
    now, span = timezone.now(), SPANS["hour"]
    tool = _tool(quiet)
    night, day = queue_make(quiet, "night"), queue_make(quiet, "day")
    at = now - timedelta(minutes=40)
    calls = calls_make(quiet, [{"at": at, "tool": tool, "status": CallStatus.SUCCEEDED, "took": 1}] * 7
                       + [{"at": at, "tool": tool, "status": CallStatus.AWAITING_APPROVAL}] * 2)
    for call, waited in zip(calls[:4], (60, 30, 120, 90), strict=True):
        request_make(quiet, call, queue=night, opened=at, waited=waited)
    request_make(quiet, calls[4], queue=day, opened=at, waited=7, status="expired")
    request_make(quiet, calls[5], queue=day, opened=at, waited=1, status="cancelled")  # nobody waited it out
    request_make(quiet, calls[6], queue=day, opened=now - timedelta(hours=3), waited=1)  # opened before the span
    request_make(quiet, calls[7], queue=day, opened=now - timedelta(hours=2))  # waiting for two hours
    request_make(quiet, calls[8], queue=night, opened=now - timedelta(minutes=1))
    waits = activity_of(tenant=quiet, span=span, now=now).approval_waits
    assert [w["name"] for w in waits] == ["day", "night"]
    day_wait, night_wait = waits
    assert night_wait == {"name": "night", "decided": 4, 50: 60.0, 95: 120.0, "pending": 1,
                          "oldest": pytest.approx(60, abs=1)}
    assert day_wait == {"name": "day", "decided": 1, 50: 7.0, 95: 7.0, "pending": 1,
                        "oldest": pytest.approx(7200, abs=1)}


def test_top_tools_and_upstream_errors_by_server(quiet):
    now, span = timezone.now(), SPANS["hour"]
    read, write = mcp_tool(quiet, "files", "read"), mcp_tool(quiet, "files", "write")
    crm, weather = mcp_tool(quiet, "crm", "find"), http_tool(quiet, "weather")
    local = _tool(quiet)
    at = now - timedelta(minutes=2)
    calls_make(quiet, [
        *[{"at": at, "tool": read, "took": 1}] * 5,
        {"at": at, "tool": read, "status": CallStatus.FAILED, "took": 1},
        {"at": at, "tool": write, "status": CallStatus.TIMED_OUT, "took": 30},
        {"at": at, "tool": write, "status": CallStatus.FAILED, "ran": False, "took": 0},  # refused before running
        {"at": at, "tool": crm, "took": 1},
        *[{"at": at, "tool": weather, "status": CallStatus.FAILED, "took": 1}] * 3,
        *[{"at": at, "tool": local, "status": CallStatus.FAILED, "took": 1}] * 2,  # not an upstream
        {"at": at, "name": "<b>made_up</b>", "status": CallStatus.FAILED, "ran": False, "took": 0},
    ])
    activity = activity_of(tenant=quiet, span=span, now=now)
    assert activity.upstream == [
        {"kind": "http", "server": "weather", "calls": 3, "failed": 3},
        {"kind": "mcp", "server": "files", "calls": 7, "failed": 2},
        {"kind": "mcp", "server": "crm", "calls": 1, "failed": 0},
    ]
    assert activity.top_tools[:3] == [
        {"name": "mcp__files__read", "calls": 6, "failed": 1},
        {"name": "weather", "calls": 3, "failed": 3},
        {"name": "lookup", "calls": 2, "failed": 2},
    ]
    assert {"name": "<b>made_up</b>", "calls": 1, "failed": 1} in activity.top_tools


def _grow(tenants, *, calls_each: int, now):
    for n, tenant in enumerate(tenants):
        tools = [_tool(tenant, f"tool_{i}") for i in range(3)] + [mcp_tool(tenant, f"srv{n}", "x"),
                                                                  http_tool(tenant, f"hook{n}")]
        queues = [queue_make(tenant, f"queue-{n}-{i}") for i in range(2)]
        specs = [{"at": now - timedelta(minutes=i % 59, seconds=i % 7), "tool": tools[i % len(tools)],
                  "status": [CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.AWAITING_APPROVAL][i % 3],
                  "took": (i % 13) / 4} for i in range(calls_each)]
        calls = calls_make(tenant, specs)
        for i, call in enumerate(calls[:12]):
            request_make(tenant, call, queue=queues[i % 2], opened=now - timedelta(minutes=i),
                         waited=None if i % 3 == 2 else i * 5)


@pytest.mark.parametrize("span", ["hour", "day"])
def test_six_queries_whatever_the_data(quiet, world, django_assert_num_queries, span):
    now = timezone.now()
    with django_assert_num_queries(6):
        empty = activity_of(tenant=quiet, span=SPANS[span], now=now)
    assert empty.total_calls == 0
    _grow([quiet, world.a.tenant, world.b.tenant], calls_each=300, now=now)
    with django_assert_num_queries(6):
        full = activity_of(tenant=quiet, span=SPANS[span], now=now)
    assert full.total_calls == 300
    assert len(full.top_tools) == 5 and len(full.upstream) == 2 and len(full.approval_waits) == 2
    # the succeeded and failed ones (200), less the 8 of them with an approval request
    assert sum(bucket["n"] for bucket in full.latency.values()) == 192
    assert connection.vendor in ("postgresql", "sqlite")
