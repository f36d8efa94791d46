"""The Celery worker's side of a call (the distributed mode): claim, lease, watch, reaper.

A worker claims a queued call with one conditional UPDATE that also takes a lease and checks the tenant's
parallel cap and the per-session order of unsafe tools; claims of one tenant queue on a transaction-scoped
advisory lock meanwhile, so the count cannot go stale (`tools.calls.statements`). It then runs the call
(`tools.calls.execution`) while the process's one `CallWatch` thread looks after all of its running calls at
once: it renews their leases in one statement, enforces their timeouts and notices cancel requests with one
read. The reaper settles calls whose lease ran out (their worker died): idempotent tools are re-queued, the
others fail with WorkerLost, so nothing runs twice by accident and nothing stays `running` forever. The
thin Celery tasks around these are in `tools.tasks`.
"""
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

from django.db import (
    DEFAULT_DB_ALIAS,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
    transaction,
)
from django.utils import timezone
from psycopg import Pipeline

from common import metrics
from tenancy.fastread import fetch_one, this_connection
from tenancy.selectors import versions_read_with
from tenancy.versions import versioned_models, versions_known
from tools.calls.events import call_transition
from tools.calls.execution import call_execute, call_settle_orphan, call_time_out
from tools.calls.statements import (
    call_statuses,
    calls_lease_renew,
    claim_commit_unflushed,
    claim_condition,
    tenant_claims_serialise,
)
from tools.models import CallStatus, ToolCall
from tools.python.isolation import CallStop

logger = logging.getLogger("toolkeeper.calls")

LEASE_S = 15.0
WATCH_S = 0.25
REAP_BATCH = 500  # lapsed calls settled per pass of the reaper; the next pass takes the rest


class ClaimOutcome:
    CLAIMED = "claimed"
    GONE = "gone"  # not queued any more: someone else ran, cancelled or settled it
    WAIT = "wait"  # the tenant is at its cap, or the session's earlier unsafe call still runs


def _call_read(call_id) -> ToolCall | None:
    """The call with its session, tool, tenant and the tenant's configuration versions, in one statement.

    A worker process keeps its connection between tasks and does not ping it before each one: a connection
    found dead here (the database restarted, an idle timeout) is opened again and the read tried once more.
    Nothing has been written yet, so the retry repeats nothing."""
    read = partial(fetch_one, ToolCall, join=("session", "tool", "tenant"), pk=call_id,
                   tenant_values=tuple((model, "version") for model in versioned_models()))
    try:
        return read()
    except (OperationalError, InterfaceError):
        connection = connections[DEFAULT_DB_ALIAS]
        if connection.in_atomic_block or connection.is_usable():
            raise
        logger.warning("the database connection was lost between tasks: opening it again")
        connection.close()
        return read()


@contextlib.contextmanager
def _claim_transaction():
    """The claim's transaction. On PostgreSQL its statements (the advisory lock, the claim with its event) go out
    together in psycopg's pipeline: BEGIN, the lock and the claim in one round trip, COMMIT in a second (four
    before). Each is still a statement of its own, with a snapshot of its own: the claim's count of running calls
    is read after the lock is held, so the cap stays exact."""
    conn = this_connection()
    with transaction.atomic():
        if conn.vendor != "postgresql":
            yield
            return
        conn.ensure_connection()
        with conn.connection.pipeline() if Pipeline.is_supported() else contextlib.nullcontext():
            yield


def call_claim_limited(*, call_id) -> tuple[str, ToolCall | None]:
    """Claim a queued call, honouring the tenant's parallel cap and per-session order of unsafe tools."""
    call = _call_read(call_id)
    if call is None or call.status != CallStatus.QUEUED:
        return ClaimOutcome.GONE, None
    call.session.tenant = call.tenant
    condition = claim_condition(call, cap=call.tenant.max_parallel_calls,
                                in_session_order=call.tool is not None and not call.tool.concurrency_safe)
    # An idempotent tool's claim commits without waiting for the disk. A database crash in the next moments may
    # then forget it, and the call, queued again, runs again, which an idempotent tool's call may do anyway (the
    # reaper re-queues it when its worker dies). The result is written with the usual wait for the disk, which
    # takes the claim's records with it: what an answer reports is on disk before it is read back. A tool that is
    # not idempotent keeps its claim on disk before it starts: at most once, whatever crashes.
    idempotent = call.tool is not None and call.tool.idempotent
    with _claim_transaction(), claim_commit_unflushed() if idempotent else contextlib.nullcontext():
        tenant_claims_serialise(call.tenant_id)
        # the lease counts from here, before the lock is held (the pipeline sends them together): a wait for the
        # lock, behind other claims of one statement each, shortens it by as much; it is renewed every LEASE_S / 3
        now = timezone.now()
        moved = call_transition(call=call, from_statuses=[CallStatus.QUEUED], to_status=CallStatus.RUNNING,
                                condition=condition, started_at=now, attempts=1,
                                lease_until=now + timedelta(seconds=LEASE_S))
    if moved:
        return ClaimOutcome.CLAIMED, call
    still_queued = call_statuses(call.tenant_id, [call.pk]).get(str(call.pk)) == CallStatus.QUEUED
    return (ClaimOutcome.WAIT, None) if still_queued else (ClaimOutcome.GONE, None)


@dataclass
class _Watched:
    call: ToolCall
    cancelled: threading.Event
    deadline: float
    timeout_s: float


class CallWatch:
    """One thread per worker process for all the calls it runs: every WATCH_S one read of their statuses
    (a cancel request, or a settle by someone else, stops the tool), their deadlines checked, and every
    LEASE_S / 3 one UPDATE renewing all their leases. A thread per call cost a thread start and, when the
    call ran long enough to be looked at, a database connection of its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls: dict[str, _Watched] = {}
        self._thread: threading.Thread | None = None
        self._has_calls = threading.Event()

    def add(self, call: ToolCall, cancelled: threading.Event, timeout_s: float) -> None:
        with self._lock:
            self._calls[str(call.pk)] = _Watched(call, cancelled, time.monotonic() + timeout_s, timeout_s)
            self._has_calls.set()
            if self._thread is None or not self._thread.is_alive():  # first call, or first in a forked child
                self._thread = threading.Thread(target=self._run, name="toolkeeper-call-watch", daemon=True)
                self._thread.start()

    def remove(self, call: ToolCall) -> None:
        with self._lock:
            self._calls.pop(str(call.pk), None)
            if not self._calls:
                self._has_calls.clear()

    def _run(self) -> None:
        renew_at = time.monotonic() + LEASE_S / 3
        while True:
            self._has_calls.wait()
            time.sleep(WATCH_S)
            try:
                renew_at = self._look(renew_at)
            except Exception:
                logger.exception("watching the running calls failed")
                close_old_connections()
                connections.close_all()  # a broken connection is replaced at the next look

    def _look(self, renew_at: float) -> float:
        with self._lock:
            watched = list(self._calls.values())
        if not watched:
            return renew_at
        now = time.monotonic()
        by_tenant: dict[int, list[_Watched]] = {}
        for item in watched:
            by_tenant.setdefault(item.call.tenant_id, []).append(item)
        if now >= renew_at:  # first: nothing below may keep the leases from being renewed
            until = timezone.now() + timedelta(seconds=LEASE_S)
            for tenant_id, items in by_tenant.items():
                calls_lease_renew(tenant_id, [item.call for item in items], until=until)
            renew_at = now + LEASE_S / 3
        for tenant_id, items in by_tenant.items():
            states = call_statuses(tenant_id, [item.call.pk for item in items], with_cancel=True)
            for item in items:
                status, cancel_requested = states.get(str(item.call.pk), (None, False))
                if status != CallStatus.RUNNING or cancel_requested:
                    self.remove(item.call)
                    item.cancelled.set()
                elif now >= item.deadline:
                    self.remove(item.call)
                    try:
                        call_time_out(call=item.call, timeout_s=item.timeout_s)
                    finally:
                        item.cancelled.set()  # the tool stops even if the timeout could not be written
        return renew_at


call_watch = CallWatch()


class _Running:
    """The calls this worker process runs now (`toolkeeper_executor_busy{executor="celery"}`)."""

    def __init__(self):
        self.lock, self.count = threading.Lock(), 0

    def add(self, change: int) -> None:
        with self.lock:
            self.count += change
            metrics.executor_busy("celery", self.count)


running = _Running()


def worker_run_call(*, call_id) -> str:
    outcome, call = call_claim_limited(call_id=call_id)
    if call is None:
        return outcome
    cancelled = CallStop()
    call_watch.add(call, cancelled, call.tool.timeout_s if call.tool else 30.0)
    running.add(1)
    try:
        # the after-execution steps check their caches against the versions read with the call
        with versions_known(call.tenant_id, *versions_read_with(call)):
            call_execute(call=call, cancelled=cancelled)
    finally:
        running.add(-1)
        call_watch.remove(call)
    return ClaimOutcome.CLAIMED


def calls_reap() -> dict:
    """Periodic: settle running calls whose worker stopped renewing the lease. Re-queued calls still need
    dispatching (the distributed runtime does that next)."""
    counts = {"requeued": 0, "failed": 0}
    now = timezone.now()
    stale = ToolCall.all_tenants.select_related("tool").filter(
        status=CallStatus.RUNNING, lease_until__lt=now)[:REAP_BATCH]
    for call in stale:
        outcome = call_settle_orphan(call, "the worker running this call stopped", lease_lapsed_by=now)
        if outcome in counts:
            counts[outcome] += 1
    return counts
