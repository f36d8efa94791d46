"""The platform's Prometheus metrics (docs/observability.md, "Metrics"): their definitions and the hooks that record
them, for every layer; the scrape (`toolkeeper.metrics`) adds what it reads from the database at that moment.

Metrics are kept in `prometheus_client`'s multiprocess mode: each process (a server, a Celery worker's child, the
MCP host process) writes its values to memory-mapped files in `PROMETHEUS_MULTIPROC_DIR`, and a scrape sums
them. The directory is defaulted inside the data dir by the settings, which every process kind loads before
this module; it is set here too, from the settings, for a process that imported this module first.

`TOOLKEEPER_METRICS=0` turns recording off: every hook returns at its first line. Labels are bounded: no call
ids, no user names; `TOOLKEEPER_METRICS_TENANT_LABELS=0` puts `_all` in every tenant label.
"""
import contextlib
import glob
import logging
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.conf import settings


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in {"0", "false", "no", "off"}


ENABLED = _flag("TOOLKEEPER_METRICS")
TENANT_LABELS = _flag("TOOLKEEPER_METRICS_TENANT_LABELS")
ALL_TENANTS = "_all"
NO_TENANT = "_none"  # a refusal before any tenant is known (the OAuth endpoints' per-address limit)

if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(settings.PROMETHEUS_MULTIPROC_DIR)
os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)

# prometheus_client picks its multiprocess values when it is first imported: after the directory is known.
from prometheus_client import (  # noqa: E402  # noqa: E402
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

# Calls end to end: from milliseconds (a denied call) to an hour (one that waited for a reviewer).
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                900, 3600)
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
FANOUT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

CALLS = Counter("toolkeeper_calls", "Calls settled, by tenant, tool source, final status and what the rules "
                "decided", ["tenant", "source", "status", "decision"])
CALL_DURATION = Histogram("toolkeeper_call_duration_seconds", "Calls from received to settled, end to end",
                          ["tenant", "source", "status"], buckets=CALL_BUCKETS)
CALL_STEP = Histogram("toolkeeper_call_step_seconds", "Time a call spends in one step of its life",
                      ["step", "source"], buckets=STEP_BUCKETS)
UPSTREAM_REQUESTS = Counter("toolkeeper_upstream_requests", "Requests to upstream MCP servers and HTTP tools",
                            ["tenant", "kind", "server", "outcome"])
UPSTREAM_SECONDS = Histogram("toolkeeper_upstream_request_seconds", "Upstream request latency",
                             ["kind", "server"], buckets=REQUEST_BUCKETS)
RATE_LIMIT_REFUSALS = Counter("toolkeeper_rate_limit_refusals", "Requests refused by a rate or in-flight limit",
                              ["tenant", "limit"])
EVENT_FANOUT = Histogram("toolkeeper_event_fanout_seconds", "Lag from a call event's append to its delivery on a "
                         "stream", buckets=FANOUT_BUCKETS)
EXECUTOR_BUSY = Gauge("toolkeeper_executor_busy", "Calls running now in this deployment's executors",
                      ["executor"], multiprocess_mode="livesum")
EXECUTOR_CAPACITY = Gauge("toolkeeper_executor_capacity", "Calls this deployment's executors can run at once",
                          ["executor"], multiprocess_mode="livesum")
AUDIT_CHAIN_BROKEN = Gauge("toolkeeper_audit_chain_broken", "1 when the last periodic verification of the tenant's "
                           "audit chain found it broken, else 0", ["tenant"], multiprocess_mode="mostrecent")

STEPS = ("admission", "policy", "approval_wait", "external_wait", "execution", "after_steps")
NO_SOURCE = "none"  # a step timed before the tool is known (admission)


def tenant_label(slug: str) -> str:
    return slug if TENANT_LABELS else ALL_TENANTS


# --- hooks: each returns at once when metrics are off -------------------------------------------------------------

def call_settled(*, tenant: str, source: str, status: str, decision: str, seconds: float | None) -> None:
    """A call reached its final status; `seconds` from received to settled, when known."""
    if not ENABLED:
        return
    tenant = tenant_label(tenant)
    CALLS.labels(tenant, source, status, decision).inc()
    if seconds is not None:
        CALL_DURATION.labels(tenant, source, status).observe(max(0.0, seconds))


def step_observe(step: str, source: str, seconds: float) -> None:
    if not ENABLED:
        return
    CALL_STEP.labels(step, source).observe(max(0.0, seconds))


class _Stopwatch:
    """A step's time from its start to its one `stop(source)` (later stops do nothing)."""

    __slots__ = ("step", "started")

    def __init__(self, step: str):
        self.step, self.started = step, time.perf_counter()

    def stop(self, source: str = NO_SOURCE) -> None:
        if self.started is not None:
            CALL_STEP.labels(self.step, source).observe(time.perf_counter() - self.started)
            self.started = None

    def stop_with(self, labeler, *args) -> None:
        """`stop(labeler(*args))`: the source is worked out only when there is a time to record."""
        if self.started is not None:
            self.stop(labeler(*args))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


class _Idle:
    """What every hook hands out with metrics off: a stopwatch and an upstream request that record nothing."""

    __slots__ = ()

    def stop(self, source: str = NO_SOURCE) -> None:
        pass

    def stop_with(self, labeler, *args) -> None:
        pass

    def failed(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        pass


IDLE = _Idle()


def stopwatch(step: str):
    """A stopwatch of `step`, started now: `.stop(source)` records it once; as a context manager, on exit."""
    return _Stopwatch(step) if ENABLED else IDLE


class _Request:
    __slots__ = ("kind", "tenant", "server", "started", "ok")

    def __init__(self, kind: str, tenant: str, server: str):
        self.kind, self.tenant, self.server = kind, tenant_label(tenant), server
        self.ok, self.started = True, time.perf_counter()

    def failed(self) -> None:
        self.ok = False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not issubclass(exc_type, Exception):
            return  # cancelled (the call was stopped), not an answer of the upstream's
        UPSTREAM_SECONDS.labels(self.kind, self.server).observe(time.perf_counter() - self.started)
        ok = self.ok and exc_type is None
        UPSTREAM_REQUESTS.labels(self.tenant, self.kind, self.server, "ok" if ok else "error").inc()


NO_REQUEST = IDLE  # marks nothing, counts nothing


def upstream_request(kind: str, *, tenant: str, server: str):
    """Time and count one upstream request (`kind` mcp or http) as a context manager: an error when it raises or
    is marked `failed()`."""
    return _Request(kind, tenant, server) if ENABLED else NO_REQUEST


def rate_limit_refused(*, tenant: str, limit: str) -> None:
    if not ENABLED:
        return
    RATE_LIMIT_REFUSALS.labels(tenant_label(tenant) if tenant != NO_TENANT else NO_TENANT, limit).inc()


def fanout_observe(seconds: float) -> None:
    if not ENABLED:
        return
    EVENT_FANOUT.observe(max(0.0, seconds))


def executor_busy(executor: str, running: int) -> None:
    if not ENABLED:
        return
    EXECUTOR_BUSY.labels(executor).set(running)


def executor_capacity(executor: str, capacity: int) -> None:
    if not ENABLED:
        return
    EXECUTOR_CAPACITY.labels(executor).set(capacity)


def audit_chain(*, tenant: str, broken: bool) -> None:
    if not ENABLED:
        return
    AUDIT_CHAIN_BROKEN.labels(tenant_label(tenant)).set(1 if broken else 0)


# --- the multiprocess directory ---------------------------------------------------------------------------------

_FILE_PID = re.compile(r"_(\d+)\.db$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def process_dead(pid: int) -> None:
    """A process that ended: its live gauges (executor busy and capacity) leave the sums."""
    multiprocess.mark_process_dead(pid)


def sweep(*, live_only: bool = False) -> int:
    """Remove the files of processes that are no longer running (never a running process's, whichever started it):
    their live gauges always; with `live_only` False (at a server's start), their counters and histograms too,
    which Prometheus then reads as the counter resets a restart makes. Returns the files removed. The directory
    belongs to one host: process ids mean nothing across hosts or containers."""
    removed = 0
    pattern = "gauge_live*.db" if live_only else "*.db"
    for path in glob.glob(os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], pattern)):
        match = _FILE_PID.search(path)
        if match is None or int(match.group(1)) == os.getpid() or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
            removed += 1
    return removed


def exposition(*collectors) -> tuple[bytes, str]:
    """The text a scrape reads: every process's values summed, and `collectors` (read at this moment)."""
    sweep(live_only=True)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST


# A process whose id an earlier, ended one had starts with that one's live gauges gone.
process_dead(os.getpid())


# --- a separate bind address: the scrape served by a process of its own choosing ------------------------------

_logger = logging.getLogger("toolkeeper.metrics")


def side_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def serve_on(address: str, scrape):
    """Serve `scrape()` (body, content type) at `/metrics` (and `/`) on `address`, if set, from a thread of this
    process; None when unset, or when another process on the host holds the address already (it serves the same
    sums). Nothing else is served, and a failed scrape answers a fixed 500."""
    if not address:
        return None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            if self.path.split("?", 1)[0] not in ("/", "/metrics"):
                self.send_error(404)
                return
            try:
                body, content_type = scrape()
            except Exception:
                _logger.exception("the metrics scrape failed")
                self.send_error(500, "the scrape failed")  # a fixed message: no detail reaches the scraper
                return
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):  # noqa: A002 (the standard library's signature)
            pass

    try:
        server = ThreadingHTTPServer(side_address(address), Handler)
    except OSError as exc:
        _logger.info("metrics address %s not taken here (%s): another process serves it", address, exc)
        return None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="toolkeeper-metrics", daemon=True).start()
    return server
