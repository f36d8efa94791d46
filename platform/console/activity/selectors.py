"""What the activity page shows, read from the database in a fixed number of queries whatever the data
(docs/observability.md, "The activity page"): one per chart, plus one for the requests waiting now.

Times are cut into buckets on the database: `Bucket` turns a timestamp into the number of its bucket since the
span's start (epoch seconds, so the same on PostgreSQL and SQLite). Percentiles are nearest-rank and computed on
the database with window functions: each bucket's (or queue's) rows are numbered by duration, and only the rows
at rank ⌈n·p⌉ come back, so a chart costs at most two rows per bucket however many calls there were.

Every query starts from the tenant and a time bound on an indexed column: calls by `(tenant, created_at)`,
approval requests by `(tenant, status, opened_at)`.
"""
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db.models import (
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    Func,
    IntegerField,
    Min,
    OuterRef,
    Q,
    Value,
    Window,
)
from django.db.models.functions import Coalesce, RowNumber
from django.utils import timezone

from approvals.models import ApprovalRequest, RequestKind, RequestStatus
from tools.models import CallStatus, ToolCall, ToolSource

PERCENTILES = (50, 95)
TOP_TOOLS = 10
TOP_SERVERS = 10
# A call of an MCP or HTTP tool that ran and ended so counts as an upstream error.
UPSTREAM_FAILED = (CallStatus.FAILED, CallStatus.TIMED_OUT)
UPSTREAM_KINDS = (ToolSource.MCP, ToolSource.HTTP)
FAILED_STATUSES = (CallStatus.FAILED, CallStatus.TIMED_OUT, CallStatus.INTERRUPTED)
# Requests that ended with a person's decision or without one (expiry); a cancelled call's request did not wait
# for anybody to the end.
DECIDED = (RequestStatus.APPROVED, RequestStatus.REJECTED, RequestStatus.RESPONDED, RequestStatus.EXPIRED)


@dataclass(frozen=True)
class Span:
    name: str
    label: str
    width: int  # seconds per bucket
    count: int  # buckets, the last one the current (partial) one

    def start(self, now: datetime) -> int:
        """The first bucket's start, in epoch seconds: buckets begin at multiples of their width."""
        return (int(now.timestamp()) // self.width - (self.count - 1)) * self.width


SPANS = {
    "hour": Span("hour", "Last hour", 60, 60),
    "day": Span("day", "Last day", 15 * 60, 96),
}


class Bucket(Func):
    """The number of the `width`-second bucket since `start` (epoch seconds) that a timestamp falls in."""

    output_field = IntegerField()

    def __init__(self, expression, *, start: int, width: int):
        super().__init__(expression)
        self.start, self.width = int(start), int(width)

    def as_sql(self, compiler, connection, **extra_context):
        sql, params = compiler.compile(self.source_expressions[0])
        if connection.vendor == "postgresql":
            seconds = f"FLOOR(EXTRACT(EPOCH FROM {sql}))::bigint"
        else:  # SQLite keeps UTC timestamps as text
            seconds = f"CAST(strftime('%%s', {sql}) AS INTEGER)"
        return f"(({seconds} - %s) / %s)", [*params, self.start, self.width]


def _rank_of(size, percentile: int):
    """⌈size · percentile / 100⌉ in integer arithmetic: the nearest-rank percentile's rank."""
    return ExpressionWrapper((size * percentile + 99) / 100, output_field=IntegerField())


def _percentile_rows(queryset, *, group: str, took):
    """The rows of `queryset` at each group's percentile ranks, with the group's size: (group, rank, size, took)."""
    numbered = queryset.annotate(
        took=ExpressionWrapper(took, output_field=DurationField()),
    ).annotate(
        rank=Window(RowNumber(), partition_by=[F(group)], order_by=[F("took").asc(), F("pk").asc()]),
        size=Window(Count("pk"), partition_by=[F(group)]),
    )
    wanted = Q()
    for percentile in PERCENTILES:
        wanted |= Q(rank=_rank_of(F("size"), percentile))
    return numbered.filter(wanted)


def _percentiles(rows, key: str) -> dict:
    """{group: {"n": size, 50: seconds, 95: seconds, **the row's other fields}} from `_percentile_rows`' rows."""
    found: dict = {}
    for row in rows:
        size = row["size"]
        entry = found.setdefault(row[key], {"n": size, **{k: v for k, v in row.items()
                                                         if k not in (key, "rank", "size", "took")}})
        for percentile in PERCENTILES:
            if row["rank"] == (size * percentile + 99) // 100:
                entry[percentile] = row["took"].total_seconds()
    return found


@dataclass
class Activity:
    span: Span
    now: datetime
    starts: list[datetime]  # each bucket's start
    by_status: dict[int, dict[str, int]] = field(default_factory=dict)  # bucket → status → calls
    latency: dict[int, dict] = field(default_factory=dict)  # bucket → {"n": calls, 50: s, 95: s}
    approval_waits: list[dict] = field(default_factory=list)  # per queue: name, decided, 50, 95, pending, oldest
    top_tools: list[dict] = field(default_factory=list)  # name, calls, failed
    upstream: list[dict] = field(default_factory=list)  # kind, server, calls, failed

    @property
    def total_calls(self) -> int:
        return sum(sum(statuses.values()) for statuses in self.by_status.values())


def activity_of(*, tenant, span: Span, now: datetime | None = None) -> Activity:
    """The tenant's activity over `span` ending `now`, in six queries (docs/observability.md)."""
    now = now or timezone.now()
    start = span.start(now)
    since = datetime.fromtimestamp(start, tz=UTC)
    activity = Activity(span=span, now=now,
                        starts=[since + timedelta(seconds=span.width * i) for i in range(span.count)])
    calls = ToolCall.objects.for_tenant(tenant).filter(created_at__gte=since).order_by()
    bucket = Bucket("created_at", start=start, width=span.width)

    # 1. Calls received per bucket, by their status now.
    for row in calls.annotate(bucket=bucket).values("bucket", "status").annotate(n=Count("pk")):
        activity.by_status.setdefault(row["bucket"], {})[row["status"]] = row["n"]

    # 2. Latency, received → finished, of the calls that ran without waiting for a person (their wait is the
    # approvals chart's), by the bucket they were received in. A call's request opens after the call was received,
    # so the span's calls' requests opened in the span: that bound (with every status) lets the anti-join read
    # the requests through their (tenant, status, opened_at) index rather than all of them.
    requests = ApprovalRequest.objects.for_tenant(tenant).order_by()
    waited = requests.filter(call_id=OuterRef("pk"), status__in=RequestStatus.values, opened_at__gte=since)
    ran = calls.filter(~Exists(waited), started_at__isnull=False, finished_at__isnull=False)
    rows = _percentile_rows(ran.annotate(bucket=bucket), group="bucket", took=F("finished_at") - F("created_at"))
    activity.latency = _percentiles(rows.values("bucket", "rank", "size", "took"), "bucket")

    # 3. How long the approval requests opened in the span waited for their end (a decision or expiry), per queue.
    approvals = requests.filter(kind=RequestKind.APPROVAL)
    decided = approvals.filter(status__in=DECIDED, opened_at__gte=since, decided_at__isnull=False)
    rows = _percentile_rows(decided.annotate(queue_key=Coalesce("queue_id", Value(0))), group="queue_key",
                            took=F("decided_at") - F("opened_at"))
    waits = _percentiles(rows.values("queue_key", "queue__name", "rank", "size", "took"), "queue_key")

    # 4. The requests waiting now, per queue, however long ago they opened.
    pending = {row["queue_key"]: row for row in (
        approvals.filter(status=RequestStatus.PENDING)
        .values(queue_key=Coalesce("queue_id", Value(0)), queue__name=F("queue__name"))
        .annotate(pending=Count("pk"), oldest=Min("opened_at")))}
    for key in sorted(waits.keys() | pending.keys(),
                      key=lambda k: ((waits.get(k) or pending[k])["queue__name"] or "", k)):
        wait, now_waiting = waits.get(key, {}), pending.get(key, {})
        activity.approval_waits.append({
            "name": (wait or now_waiting)["queue__name"] or "(no queue)",
            "decided": wait.get("n", 0), 50: wait.get(50), 95: wait.get(95),
            "pending": now_waiting.get("pending", 0),
            "oldest": (now - now_waiting["oldest"]).total_seconds() if now_waiting else None,
        })

    # 5. The tools called most in the span, with their failures.
    failed = Count("pk", filter=Q(status__in=FAILED_STATUSES))
    activity.top_tools = [
        {"name": row["tool_name"], "calls": row["calls"], "failed": row["failed"]}
        for row in calls.values("tool_name").annotate(calls=Count("pk"), failed=failed)
        .order_by("-calls", "tool_name")[:TOP_TOOLS]]

    # 6. Upstream errors: calls of MCP and HTTP tools that ran, by server (an MCP server; an HTTP tool is its own).
    upstream_failed = Count("pk", filter=Q(status__in=UPSTREAM_FAILED))
    activity.upstream = [
        {"kind": row["tool__source"], "server": row["server"], "calls": row["calls"], "failed": row["failed"]}
        for row in calls.filter(tool__source__in=UPSTREAM_KINDS, started_at__isnull=False)
        .values("tool__source", server=Coalesce("tool__mcp_server__name", "tool__name"))
        .annotate(calls=Count("pk"), failed=upstream_failed)
        .order_by("-failed", "-calls", "tool__source", "server")[:TOP_SERVERS]]
    return activity
