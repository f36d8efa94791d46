"""`/metrics` (docs/observability.md, "Exposing /metrics"): every process's metrics (common.metrics) summed, and the
gauges read from the database at the scrape, in a constant number of queries whatever the number of tenants and
queues.

The endpoint is never public by default: it answers a bearer token (`TOOLKEEPER_METRICS_TOKEN`, compared in constant
time) or serves on a separate bind address (`TOOLKEEPER_METRICS_ADDR`, where whoever reaches the address may read
it); with neither, `/metrics` answers 404 as an unknown path would. It belongs to no tenant.
"""
import hmac
import logging
from collections import defaultdict

from django.conf import settings
from django.db import close_old_connections, connections
from django.db.models import Count, Min, Q
from django.http import Http404, HttpResponse, HttpResponseNotAllowed
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from approvals.models import ApprovalRequest, RequestStatus
from common import metrics
from tenancy.entry.authentication import bearer_token
from tools.models import CallStatus, ToolCall

logger = logging.getLogger("toolkeeper.metrics")

NO_QUEUE = "_none"  # a request whose queue was deleted


class DatabaseGauges:
    """The gauges a scrape reads from the database: approvals pending, their oldest age and those overdue per
    tenant and queue (one query); external calls waiting and calls queued per tenant (one query)."""

    @staticmethod
    def describe():
        """The families, empty: what a scrape will have (prometheus_client calls this at registration)."""
        tenant_queue = ["tenant", "queue"]
        return [
            GaugeMetricFamily("toolkeeper_approvals_pending", "Open approval requests", labels=tenant_queue),
            GaugeMetricFamily("toolkeeper_approvals_oldest_age_seconds", "Age of the oldest open approval request",
                              labels=tenant_queue),
            GaugeMetricFamily("toolkeeper_approvals_overdue", "Open approval requests past their expiry (the expiry "
                              "job is behind)", labels=tenant_queue),
            GaugeMetricFamily("toolkeeper_external_calls_waiting", "External tool calls waiting for a posted result",
                              labels=["tenant"]),
            GaugeMetricFamily("toolkeeper_calls_queued", "Calls queued, not yet claimed", labels=["tenant"]),
        ]

    def collect(self):
        now = timezone.now()
        pending, oldest, overdue, waiting, queued = self.describe()
        queues: dict[tuple[str, str], list] = defaultdict(lambda: [0, None, 0])
        rows = (ApprovalRequest.all_tenants.filter(status=RequestStatus.PENDING)
                .values_list("tenant__slug", "queue__name")
                .annotate(count=Count("id"), first=Min("opened_at"), late=Count("id", filter=Q(expires_at__lt=now)))
                .order_by())
        for slug, queue, count, first, late in rows:
            entry = queues[(metrics.tenant_label(slug), queue if queue is not None else NO_QUEUE)]
            entry[0] += count
            entry[1] = first if entry[1] is None else min(entry[1], first)
            entry[2] += late
        for labels, (count, first, late) in sorted(queues.items()):
            pending.add_metric(labels, count)
            oldest.add_metric(labels, max(0.0, (now - first).total_seconds()))
            overdue.add_metric(labels, late)

        counts = {CallStatus.AWAITING_EXTERNAL: defaultdict(int), CallStatus.QUEUED: defaultdict(int)}
        rows = (ToolCall.all_tenants.filter(status__in=list(counts)).values_list("tenant__slug", "status")
                .annotate(count=Count("id")).order_by())
        for slug, status, count in rows:
            counts[status][metrics.tenant_label(slug)] += count
        for family, status in ((waiting, CallStatus.AWAITING_EXTERNAL), (queued, CallStatus.QUEUED)):
            for tenant, count in sorted(counts[status].items()):
                family.add_metric([tenant], count)
        return [pending, oldest, overdue, waiting, queued]


def scrape() -> tuple[bytes, str]:
    return metrics.exposition(DatabaseGauges())


def token_matches(authorization: str, token: str) -> bool:
    presented = bearer_token(authorization) or ""
    return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), token.encode())


def metrics_view(request):
    """GET /metrics with `Authorization: Bearer <TOOLKEEPER_METRICS_TOKEN>`; 404 without a token configured."""
    token = settings.TOOLKEEPER_METRICS_TOKEN
    if not token:
        raise Http404("no such page")
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    if not token_matches(request.headers.get("Authorization", ""), token):
        response = HttpResponse("A valid bearer token is required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    body, content_type = scrape()
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response


def _scrape_closing() -> tuple[bytes, str]:
    """A scrape on the separate address: each is a thread of its own, so its connection ends with it."""
    try:
        return scrape()
    finally:
        close_old_connections()
        connections.close_all()


def side_server_start():
    """Serve the scrape on TOOLKEEPER_METRICS_ADDR, if set, from this server process (common.metrics.serve_on)."""
    return metrics.serve_on(settings.TOOLKEEPER_METRICS_ADDR, _scrape_closing)
