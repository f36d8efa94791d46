"""The Celery worker's side, in this process on the test database: the claim (one conditional UPDATE under
a per-tenant advisory lock, so the parallel cap is exact whoever claims at once) and the one watch thread
that renews the leases of all of a process's calls, notices cancels and enforces timeouts."""
import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connections
from django.utils import timezone

from tests.tools.support import claim_lock_held_elsewhere, poll
from tools.calls import worker
from tools.calls.worker import CallWatch, ClaimOutcome, call_claim_limited
from tools.models import CallEvent, CallStatus, ToolCall
from tools.python.isolation import CallStop

pytestmark = [pytest.mark.django_db(transaction=True)]


def queued_calls(tenant_world, count: int, *, tool_name: str = "current_time", session=None) -> list[ToolCall]:
    session = session or tenant_world.session
    tool = tenant_world.tools[tool_name]
    calls = []
    for n in range(count):
        call = ToolCall.objects.create(tenant=tenant_world.tenant, session=session, call_id=f"q{n}_{tool_name}",
                                       tool=tool, tool_name=tool_name, effective_input={},
                                       status=CallStatus.QUEUED)
        calls.append(call)
    return calls


def claim_all_at_once(calls: list[ToolCall]) -> list[str]:
    """Every call claimed from a thread of its own, released together."""
    outcomes: list[str | None] = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def claim(n: int) -> None:
        try:
            barrier.wait()
            outcomes[n] = call_claim_limited(call_id=calls[n].pk)[0]
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_a_claim_moves_a_queued_call_to_running_with_a_lease_and_its_event(world):
    call, = queued_calls(world.a, 1)
    outcome, claimed = call_claim_limited(call_id=call.pk)
    assert outcome == ClaimOutcome.CLAIMED
    assert claimed.tool.name == "current_time" and claimed.session.tenant.pk == world.a.tenant.pk
    call.refresh_from_db()
    assert call.status == CallStatus.RUNNING and call.attempts == 1
    assert call.lease_until > timezone.now() + timedelta(seconds=worker.LEASE_S - 5)
    event = call.events.get(seq=call.event_seq)
    assert (event.kind, event.data["status"]) == ("status", CallStatus.RUNNING)
    assert call_claim_limited(call_id=call.pk) == (ClaimOutcome.GONE, None)


def test_the_parallel_cap_is_exact_when_many_workers_claim_at_once(world):
    tenant = world.a.tenant
    tenant.max_parallel_calls = 2
    tenant.save(update_fields=["max_parallel_calls"])
    calls = queued_calls(world.a, 6)
    outcomes = claim_all_at_once(calls)
    assert sorted(outcomes) == [ClaimOutcome.CLAIMED] * 2 + [ClaimOutcome.WAIT] * 4
    statuses = sorted(ToolCall.objects.for_tenant(tenant).filter(pk__in=[c.pk for c in calls])
                      .values_list("status", flat=True))
    assert statuses == [CallStatus.QUEUED] * 4 + [CallStatus.RUNNING] * 2
    # another tenant's calls do not count against this one's cap
    other, = queued_calls(world.b, 1)
    assert call_claim_limited(call_id=other.pk)[0] == ClaimOutcome.CLAIMED


def test_an_unsafe_tool_runs_in_session_order(world):
    tool = world.a.tools["current_time"]
    tool.concurrency_safe = False
    tool.save(update_fields=["concurrency_safe"])
    first, second = queued_calls(world.a, 2)
    assert call_claim_limited(call_id=second.pk) == (ClaimOutcome.WAIT, None)  # the earlier one is queued
    assert call_claim_limited(call_id=first.pk)[0] == ClaimOutcome.CLAIMED
    assert call_claim_limited(call_id=second.pk) == (ClaimOutcome.WAIT, None)  # … and now running
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk=first.pk).update(status=CallStatus.SUCCEEDED)
    assert call_claim_limited(call_id=second.pk)[0] == ClaimOutcome.CLAIMED


@pytest.fixture
def fast_watch(monkeypatch):
    monkeypatch.setattr(worker, "WATCH_S", 0.02)
    monkeypatch.setattr(worker, "LEASE_S", 0.3)  # renewed every 0.1 s
    watch = CallWatch()
    yield watch
    with watch._lock:
        watch._calls.clear()


def claimed(tenant_world, count: int) -> list[ToolCall]:
    calls = queued_calls(tenant_world, count)
    return [call_claim_limited(call_id=call.pk)[1] for call in calls]


def test_one_watch_renews_every_lease_and_stops_what_was_cancelled(world, fast_watch):
    calls = claimed(world.a, 2) + claimed(world.b, 1)
    stops = [CallStop() for _ in calls]
    for call, stop in zip(calls, stops, strict=True):
        fast_watch.add(call, stop, 60)
    first_leases = {c.pk: c.lease_until for c in ToolCall.all_tenants.filter(pk__in=[c.pk for c in calls])}

    def renewed():
        rows = ToolCall.all_tenants.filter(pk__in=[c.pk for c in calls]).values_list("pk", "lease_until")
        return all(lease > first_leases[pk] for pk, lease in rows)

    poll(renewed, message="every lease renewed")
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk=calls[1].pk).update(cancel_requested=True)
    poll(stops[1].is_set, message="the cancel noticed")
    assert not stops[0].is_set() and not stops[2].is_set()
    assert set(fast_watch._calls) == {str(calls[0].pk), str(calls[2].pk)}
    fast_watch.remove(calls[1])  # the run's own `finally`, after the watch already let the call go
    assert set(fast_watch._calls) == {str(calls[0].pk), str(calls[2].pk)}


def test_the_watch_times_a_call_out(world, fast_watch):
    call, = claimed(world.a, 1)
    stop = CallStop()
    fast_watch.add(call, stop, 0.1)
    poll(stop.is_set, message="the timeout")
    call.refresh_from_db()
    assert call.status == CallStatus.TIMED_OUT
    assert call.error["errorType"] == "TimedOut"



def test_a_watch_built_in_the_test_starts_watching_with_its_first_call(world, monkeypatch):
    """The watch made here, not by a fixture: its construction is part of what this test checks."""
    monkeypatch.setattr(worker, "WATCH_S", 0.02)
    watch = CallWatch()
    call, = claimed(world.a, 1)
    stop = CallStop()
    try:
        watch.add(call, stop, 0.1)
        poll(stop.is_set, message="the timeout")
        assert watch._thread.is_alive()
    finally:
        with watch._lock:
            watch._calls.clear()
            watch._has_calls.clear()

def test_a_watch_whose_thread_is_gone_starts_another(world, fast_watch):
    """A forked worker process inherits the watch, but not its thread."""
    gone = threading.Thread(target=lambda: None)
    gone.start()
    gone.join()
    fast_watch._thread = gone
    call, = claimed(world.a, 1)
    stop = CallStop()
    fast_watch.add(call, stop, 0.1)
    poll(stop.is_set, message="the timeout, seen by a new thread")
    assert fast_watch._thread is not gone and fast_watch._thread.is_alive()


def test_the_claim_does_not_lock_the_tenant_row(world):
    """A claim in progress must not hold up the tenant's other writes (rows that refer to the tenant)."""
    if not settings.USING_POSTGRES:
        pytest.skip("row locks: PostgreSQL")
    call, = queued_calls(world.a, 1)
    # blocked, the writes below would fail instead of hanging
    with claim_lock_held_elsewhere(world.a.tenant.pk, lock_timeout="5s"):
        CallEvent.objects.create(tenant=world.a.tenant, call=call, seq=1, kind="output", data={"text": "x"},
                                 at=timezone.now())
        ToolCall.objects.for_tenant(world.a.tenant).filter(pk=call.pk).update(status=CallStatus.CANCELLED)


def test_a_claim_opens_a_connection_lost_between_tasks_again(world):
    """Workers keep their connection between tasks without pinging it first: a dead one is found on the claim's
    first read (which writes nothing) and opened again, and the claim goes on."""
    connection = connections["default"]
    if connection.vendor != "postgresql":
        pytest.skip("a server-side end of the connection needs PostgreSQL")
    call, = queued_calls(world.a, 1)
    connection.ensure_connection()
    backend = connection.connection.info.backend_pid

    def end_it() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [backend])  # waits until it has ended
        finally:
            connections.close_all()

    thread = threading.Thread(target=end_it)
    thread.start()
    thread.join()
    outcome, claimed = call_claim_limited(call_id=call.pk)
    assert outcome == ClaimOutcome.CLAIMED
    assert connection.connection.info.backend_pid != backend
    call.refresh_from_db()
    assert call.status == CallStatus.RUNNING
