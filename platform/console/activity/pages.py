"""The activity page: a tenant's calls over the last hour or day, as charts with their numbers beside them
(docs/observability.md, "The activity page"). The view reads `selectors.activity_of` and shapes it for the
template; the page follows the tenant's call stream and reloads its charts when calls change."""
from django.shortcuts import render
from django.utils import timezone

from console.activity.charts import Series, bar_chart, column_chart, legend, line_chart
from console.activity.selectors import PERCENTILES, SPANS, Activity, activity_of
from tenancy.web import duration_text, tenant_view
from tools.models import CallStatus

# A colour per status (presentation attributes of the charts), in the order CallStatus lists them.
STATUS_COLOURS = {
    CallStatus.RECEIVED: "#9db4e8", CallStatus.QUEUED: "#6f8fd8", CallStatus.RUNNING: "#2f5bd3",
    CallStatus.SUCCEEDED: "#2e8540", CallStatus.FAILED: "#c62828", CallStatus.DENIED: "#7b1f1f",
    CallStatus.AWAITING_APPROVAL: "#e0a100", CallStatus.AWAITING_EXTERNAL: "#0f8a8a", CallStatus.REJECTED: "#e06c00",
    CallStatus.EXPIRED: "#8a8f99", CallStatus.CANCELLED: "#5d6678", CallStatus.TIMED_OUT: "#8e44ad",
    CallStatus.INTERRUPTED: "#8d5524",
}
P50, P95 = "#2f5bd3", "#e06c00"
CALLS, FAILED = "#6f8fd8", "#c62828"
DEFAULT_SPAN = "hour"


def _seconds(value: float | None) -> str:
    return "" if value is None else duration_text(value)


def _count(value: float) -> str:
    return str(round(value))


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _labels(activity: Activity) -> list[str]:
    """Each bucket's start in the viewer's time zone."""
    return [timezone.localtime(start).strftime("%H:%M") for start in activity.starts]


def _calls(activity: Activity, labels: list[str]) -> dict:
    seen = {status for statuses in activity.by_status.values() for status in statuses}
    statuses = [status for status in CallStatus.values if status in seen]
    counts = [activity.by_status.get(i, {}) for i in range(activity.span.count)]
    totals = {status: sum(bucket.get(status, 0) for bucket in counts) for status in statuses}
    busiest = max(range(len(counts)), key=lambda i: (sum(counts[i].values()), i)) if seen else None
    per = "minute" if activity.span.width == 60 else f"{activity.span.width // 60} minutes"
    summary = (f"{_n(activity.total_calls, 'call')}: "
               + ", ".join(f"{totals[status]} {status}" for status in statuses)
               + f"; the busiest {per} began at {labels[busiest]} ({_n(sum(counts[busiest].values()), 'call')})."
               if seen else "No calls.")
    return {
        "svg": column_chart(
            chart_id="chart-calls", title=f"Calls per {per} by status", desc=summary, labels=labels, fmt=_count,
            series=[Series(status, STATUS_COLOURS[status], [bucket.get(status, 0) for bucket in counts])
                    for status in statuses]),
        "legend": legend([(status, STATUS_COLOURS[status]) for status in statuses]),
        "statuses": statuses,
        "rows": [(labels[i], sum(bucket.values()), [bucket.get(status, 0) for status in statuses])
                 for i, bucket in enumerate(counts) if bucket],
        "total": activity.total_calls,
        "summary": summary,
    }


def _latency(activity: Activity, labels: list[str]) -> dict:
    buckets = [activity.latency.get(i) for i in range(activity.span.count)]
    measured = sum(bucket["n"] for bucket in buckets if bucket)
    slowest = max((i for i, bucket in enumerate(buckets) if bucket), key=lambda i: (buckets[i][95], i), default=None)
    summary = (f"{_n(measured, 'call')} ran without waiting for a person; the slowest p95 was "
               f"{duration_text(buckets[slowest][95])}, at {labels[slowest]}." if measured else "No call finished.")
    return {
        "svg": line_chart(
            chart_id="chart-latency", title="Latency, received to finished: p50 and p95", desc=summary, labels=labels,
            fmt=duration_text, series=[Series(f"p{p}", colour, [bucket[p] if bucket else None for bucket in buckets])
                                       for p, colour in zip(PERCENTILES, (P50, P95), strict=True)]),
        "legend": legend([("p50", P50), ("p95", P95)]),
        "rows": [(labels[i], bucket["n"], duration_text(bucket[50]), duration_text(bucket[95]))
                 for i, bucket in enumerate(buckets) if bucket],
        "measured": measured,
        "summary": summary,
    }


def _approvals(activity: Activity) -> dict:
    queues = activity.approval_waits
    decided = sum(queue["decided"] for queue in queues)
    pending = sum(queue["pending"] for queue in queues)
    summary = (f"{_n(decided, 'request')} decided, {pending} waiting now, in {_n(len(queues), 'queue')}." if queues
               else "No approval requests.")
    return {
        "svg": bar_chart(
            chart_id="chart-approvals", title="Approval wait per queue: p50 and p95", desc=summary, fmt=duration_text,
            rows=[(queue["name"], [queue[50], queue[95]]) for queue in queues if queue["decided"]],
            series=[("p50", P50), ("p95", P95)]) if decided else None,
        "legend": legend([("p50", P50), ("p95", P95)]),
        "rows": [(queue["name"], queue["decided"], _seconds(queue[50]), _seconds(queue[95]), queue["pending"],
                  _seconds(queue["oldest"])) for queue in queues],
        "summary": summary,
    }


def _top_tools(activity: Activity) -> dict:
    tools = activity.top_tools
    summary = (f"The {_n(len(tools), 'tool')} called most; {tools[0]['name']} the most "
               f"({_n(tools[0]['calls'], 'call')})." if tools else "No calls.")
    return {
        "svg": bar_chart(
            chart_id="chart-tools", title="Top tools: calls and failures", desc=summary, fmt=_count,
            rows=[(tool["name"], [tool["calls"], tool["failed"]]) for tool in tools],
            series=[("calls", CALLS), ("failed", FAILED)]) if tools else None,
        "legend": legend([("calls", CALLS), ("failed", FAILED)]),
        "rows": [(tool["name"], tool["calls"], tool["failed"]) for tool in tools],
        "summary": summary,
    }


def _upstream(activity: Activity) -> dict:
    servers = activity.upstream
    failed = sum(server["failed"] for server in servers)
    summary = (f"{failed} failed of {_n(sum(server['calls'] for server in servers), 'call')} to "
               f"{_n(len(servers), 'upstream server')}." if servers else "No calls of MCP or HTTP tools.")
    return {
        "svg": bar_chart(
            chart_id="chart-upstream", title="Upstream errors by server", desc=summary, fmt=_count,
            rows=[(f"{server['server']} ({server['kind']})", [server["calls"], server["failed"]])
                  for server in servers],
            series=[("calls", CALLS), ("failed", FAILED)]) if servers else None,
        "legend": legend([("calls", CALLS), ("failed", FAILED)]),
        "rows": [(server["server"], server["kind"], server["calls"], server["failed"],
                  f"{100 * server['failed'] / server['calls']:.0f} %") for server in servers],
        "failed": failed,
        "summary": summary,
    }


@tenant_view()
def activity(request):
    """Every member sees the tenant's activity (`?span=hour`, the default, or `?span=day`)."""
    span = SPANS.get(request.GET.get("span", ""), SPANS[DEFAULT_SPAN])
    data = activity_of(tenant=request.tenant, span=span)
    labels = _labels(data)
    return render(request, "console/activity.html", {
        "span": span, "spans": SPANS.values(),
        "calls": _calls(data, labels), "latency": _latency(data, labels), "approvals": _approvals(data),
        "top_tools": _top_tools(data), "upstream": _upstream(data),
    })
