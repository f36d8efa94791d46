"""The Celery worker's side of a call (the distributed mode): claim, lease, watchdog, reaper.

A worker claims a queued call by a conditional UPDATE that also takes a lease, under a per-tenant row
lock that keeps the tenant's parallel cap and the per-session order of unsafe tools; then runs it
(`tools.execution`) with a watchdog thread beside it that renews the lease, enforces the tool's timeout
and notices cancel requests. The reaper settles calls whose lease ran out (their worker died):
idempotent tools are re-queued, the others fail with WorkerLost, so nothing runs twice by accident and
nothing stays `running` forever. The thin Celery tasks around these are in `tools.tasks`.
"""
import logging
import threading
import time
from datetime import timedelta

from django.db import connections, transaction
from django.utils import timezone

from tenancy.models import Tenant

from .events import call_transition
from .execution import call_execute, call_settle_orphan, call_time_out
from .isolation import CallStop
from .models import CallStatus, ToolCall

logger = logging.getLogger("toolkeeper.calls")

LEASE_S = 15.0
WATCH_S = 0.25


class ClaimOutcome:
    CLAIMED = "claimed"
    GONE = "gone"  # not queued any more: someone else ran, cancelled or settled it
    WAIT = "wait"  # the tenant is at its cap, or the session's earlier unsafe call still runs


def call_claim_limited(*, call_id) -> tuple[str, ToolCall | None]:
    """Claim a queued call, honouring the tenant's parallel cap and per-session order of unsafe tools."""
    with transaction.atomic():
        call = ToolCall.all_tenants.select_related("session", "session__tenant", "tool", "tenant").filter(
            pk=call_id).first()
        if call is None or call.status != CallStatus.QUEUED:
            return ClaimOutcome.GONE, None
        # One claimant per tenant at a time, so the running count below cannot go stale.
        tenant = Tenant.objects.select_for_update().get(pk=call.tenant_id)
        calls = ToolCall.objects.for_tenant(tenant)
        if calls.filter(status=CallStatus.RUNNING).count() >= tenant.max_parallel_calls:
            return ClaimOutcome.WAIT, None
        if call.tool is not None and not call.tool.concurrency_safe:
            unsafe = calls.filter(session_id=call.session_id, tool__concurrency_safe=False)
            if unsafe.filter(status=CallStatus.RUNNING).exists() or unsafe.filter(
                    status=CallStatus.QUEUED, created_at__lt=call.created_at).exists():
                return ClaimOutcome.WAIT, None
        moved = call_transition(call=call, from_statuses=[CallStatus.QUEUED], to_status=CallStatus.RUNNING,
                                started_at=timezone.now(), attempts=1,
                                lease_until=timezone.now() + timedelta(seconds=LEASE_S))
    return (ClaimOutcome.CLAIMED, call) if moved else (ClaimOutcome.GONE, None)


def _watch(call: ToolCall, cancelled: threading.Event, finished: threading.Event, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    renew_at = time.monotonic() + LEASE_S / 3
    try:
        while not finished.wait(WATCH_S):
            now = time.monotonic()
            if now >= deadline:
                call_time_out(call=call, timeout_s=timeout_s)
                cancelled.set()
                return
            row = ToolCall.objects.for_tenant(call.tenant_id).filter(pk=call.pk).values(
                "status", "cancel_requested").first()
            if row is None or row["status"] != CallStatus.RUNNING or row["cancel_requested"]:
                cancelled.set()
                return
            if now >= renew_at:
                ToolCall.objects.for_tenant(call.tenant_id).filter(pk=call.pk, status=CallStatus.RUNNING).update(
                    lease_until=timezone.now() + timedelta(seconds=LEASE_S))
                renew_at = now + LEASE_S / 3
    except Exception:
        logger.exception("watchdog of call %s failed", call.pk)
    finally:
        connections.close_all()  # this thread ends here: its connection must not outlive it


def worker_run_call(*, call_id) -> str:
    outcome, call = call_claim_limited(call_id=call_id)
    if call is None:
        return outcome
    cancelled, finished = CallStop(), threading.Event()
    timeout_s = call.tool.timeout_s if call.tool else 30.0
    watchdog = threading.Thread(target=_watch, args=(call, cancelled, finished, timeout_s), daemon=True)
    watchdog.start()
    try:
        call_execute(call=call, cancelled=cancelled)
    finally:
        finished.set()
        watchdog.join(timeout=5)
    return ClaimOutcome.CLAIMED


def calls_reap() -> dict:
    """Periodic: settle running calls whose worker stopped renewing the lease. Re-queued calls still need
    dispatching (the distributed runtime does that next)."""
    counts = {"requeued": 0, "failed": 0}
    stale = ToolCall.all_tenants.select_related("tool").filter(
        status=CallStatus.RUNNING, lease_until__lt=timezone.now())[:500]
    for call in stale:
        outcome = call_settle_orphan(call, "the worker running this call stopped")
        if outcome in counts:
            counts[outcome] += 1
    return counts
