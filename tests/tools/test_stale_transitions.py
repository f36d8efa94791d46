"""Stale copies against the conditional updates that keep a call's state machine exact: its transitions, the
worker's claim and the reaper. Each test reads a copy, lets another actor move the call on, then acts with
the old copy; the interleaving is written out step by step (a claim's, through the hook it runs between its
read and its UPDATE), not left to timing."""
from datetime import timedelta

import pytest
from django.utils import timezone

from common.errors import Conflict
from tools.calls import worker
from tools.calls.events import call_fail, call_transition
from tools.calls.execution import call_settle_orphan
from tools.calls.submit import call_cancel
from tools.calls.worker import ClaimOutcome, call_claim_limited, calls_reap
from tools.models import CallStatus, ToolCall

pytestmark = [pytest.mark.django_db(transaction=True)]


def a_call(tenant_world, *, status: str, tool_name: str = "current_time", call_id: str = "stale", **fields) -> ToolCall:
    return ToolCall.objects.create(tenant=tenant_world.tenant, session=tenant_world.session, call_id=call_id,
                                   tool=tenant_world.tools[tool_name], tool_name=tool_name, effective_input={},
                                   status=status, **fields)


def read(call: ToolCall) -> ToolCall:
    return ToolCall.objects.for_tenant(call.tenant_id).select_related("tool").get(pk=call.pk)


def statuses(call: ToolCall) -> list[str]:
    return [e.data["status"] for e in read(call).events.order_by("seq") if e.kind == "status"]


def claimed_in_between(monkeypatch, call: ToolCall) -> None:
    """The next claim, between its read of its call and its UPDATE, first lets another worker claim `call`."""
    serialise = worker.tenant_claims_serialise

    def another_claim_first(tenant_id):
        monkeypatch.setattr(worker, "tenant_claims_serialise", serialise)
        assert call_claim_limited(call_id=call.pk)[0] == ClaimOutcome.CLAIMED
        serialise(tenant_id)

    monkeypatch.setattr(worker, "tenant_claims_serialise", another_claim_first)


def test_a_stale_copy_cannot_move_a_call_settled_since(world):
    call = a_call(world.a, status=CallStatus.RUNNING)
    stale = read(call)  # the executor's copy while it ran
    assert call_transition(call=read(call), from_statuses=[CallStatus.RUNNING], to_status=CallStatus.SUCCEEDED)
    assert not call_fail(call=stale, error_type="ToolError", message="late", from_statuses=[CallStatus.RUNNING])
    assert not call_transition(call=stale, from_statuses=[CallStatus.RUNNING], to_status=CallStatus.INTERRUPTED)
    assert read(call).status == CallStatus.SUCCEEDED
    assert statuses(call) == ["succeeded"]


def test_a_cancel_with_a_stale_copy_of_a_finished_call_is_a_conflict(world):
    call = a_call(world.a, status=CallStatus.RUNNING)
    stale = read(call)  # the call page, loaded while it ran
    assert call_transition(call=read(call), from_statuses=[CallStatus.RUNNING], to_status=CallStatus.SUCCEEDED)
    with pytest.raises(Conflict, match="already succeeded"):
        call_cancel(call=stale)
    assert (read(call).status, read(call).cancel_requested) == (CallStatus.SUCCEEDED, False)


def test_a_claim_that_another_worker_took_first_is_gone(world, monkeypatch):
    """Two workers hold the same message: the other claims between this one's read and its UPDATE."""
    call = a_call(world.a, status=CallStatus.QUEUED)
    claimed_in_between(monkeypatch, call)
    assert call_claim_limited(call_id=call.pk) == (ClaimOutcome.GONE, None)
    claimed = read(call)
    assert (claimed.status, claimed.attempts) == (CallStatus.RUNNING, 1)
    assert statuses(call) == ["running"]


def test_a_claim_counts_the_cap_in_its_own_update_not_in_its_read(world, monkeypatch):
    """With a cap of one, another call claimed between this claim's read and its UPDATE makes it wait."""
    world.a.tenant.max_parallel_calls = 1
    world.a.tenant.save(update_fields=["max_parallel_calls"])
    mine, other = a_call(world.a, status=CallStatus.QUEUED), a_call(world.a, status=CallStatus.QUEUED, call_id="other")
    claimed_in_between(monkeypatch, other)
    assert call_claim_limited(call_id=mine.pk) == (ClaimOutcome.WAIT, None)
    assert (read(mine).status, read(other).status) == (CallStatus.QUEUED, CallStatus.RUNNING)


@pytest.mark.parametrize("tool_name,orphaned", [("current_time", "requeued"), ("slow_write", "failed")])
def test_the_reaper_leaves_a_call_whose_lease_was_renewed_after_it_looked(world, tool_name, orphaned):
    lapsed = timezone.now() - timedelta(seconds=1)
    call = a_call(world.a, status=CallStatus.RUNNING, tool_name=tool_name, lease_until=lapsed, attempts=1)
    assert read(call).tool.idempotent == (orphaned == "requeued")
    looked_at = timezone.now()
    stale = read(call)  # the reaper's copy: running, lease lapsed
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk=call.pk).update(  # the worker renews, late but alive
        lease_until=timezone.now() + timedelta(seconds=worker.LEASE_S))
    assert call_settle_orphan(stale, "the worker stopped", lease_lapsed_by=looked_at) == "unchanged"
    assert (read(call).status, read(call).attempts) == (CallStatus.RUNNING, 1)
    assert statuses(call) == []
    # Lapsed for real: the reaper takes it.
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk=call.pk).update(lease_until=lapsed)
    assert calls_reap() == {"requeued": 0, "failed": 0} | {orphaned: 1}
    assert read(call).status == (CallStatus.QUEUED if orphaned == "requeued" else CallStatus.FAILED)


def test_the_periodic_reaper_reads_then_moves_only_what_is_still_lapsed(world, monkeypatch):
    """The job itself: the worker's renewal lands between the reaper's read of lapsed calls and its move."""
    call = a_call(world.a, status=CallStatus.RUNNING, tool_name="slow_write", attempts=1,
                  lease_until=timezone.now() - timedelta(seconds=1))
    settle = worker.call_settle_orphan

    def renewed_first(stale, reason, **kwargs):
        ToolCall.objects.for_tenant(world.a.tenant).filter(pk=stale.pk).update(
            lease_until=timezone.now() + timedelta(seconds=worker.LEASE_S))
        return settle(stale, reason, **kwargs)

    monkeypatch.setattr(worker, "call_settle_orphan", renewed_first)
    assert calls_reap() == {"requeued": 0, "failed": 0}
    assert (read(call).status, read(call).error) == (CallStatus.RUNNING, None)


def test_the_reaper_hands_on_only_running_calls_whose_lease_lapsed(world, monkeypatch):
    """Settled calls keep their last lease: were they read too, they would fill the reaper's batch, and a
    batch full of calls with live leases would do the same, so the orphans behind them would wait."""
    lapsed, alive = timezone.now() - timedelta(seconds=1), timezone.now() + timedelta(seconds=60)
    orphan = a_call(world.a, status=CallStatus.RUNNING, tool_name="slow_write", lease_until=lapsed, attempts=1)
    a_call(world.a, status=CallStatus.SUCCEEDED, call_id="settled", lease_until=lapsed, attempts=1)
    a_call(world.b, status=CallStatus.RUNNING, call_id="alive", lease_until=alive, attempts=1)
    handed = []
    settle = worker.call_settle_orphan

    def handed_on(call, *args, **kwargs):
        handed.append(call.pk)
        return settle(call, *args, **kwargs)

    monkeypatch.setattr(worker, "call_settle_orphan", handed_on)
    assert calls_reap() == {"requeued": 0, "failed": 1}
    assert handed == [orphan.pk]
    failed = read(orphan)
    assert (failed.status, failed.error["errorType"], failed.error["error"]) == (
        CallStatus.FAILED, "WorkerLost", "the worker running this call stopped")


def test_the_reaper_settles_a_batch_per_pass(world, monkeypatch):
    monkeypatch.setattr(worker, "REAP_BATCH", 1)
    lapsed = timezone.now() - timedelta(seconds=1)
    calls = [a_call(world.a, status=CallStatus.RUNNING, tool_name="slow_write", call_id=f"o{i}", lease_until=lapsed,
                    attempts=1) for i in range(2)]
    assert calls_reap() == {"requeued": 0, "failed": 1}
    assert calls_reap() == {"requeued": 0, "failed": 1}
    assert calls_reap() == {"requeued": 0, "failed": 0}
    assert {read(call).status for call in calls} == {CallStatus.FAILED}
