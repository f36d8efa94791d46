"""The worker's side of a call, step by step and on a clock of the test's own: the watch's loop runs in the test's
thread, each of its sleeps moves the clock to the next scripted instant (and lets the test act there), so when
leases are renewed, cancels noticed and timeouts enforced is exact, not left to timing. Then the worker's task
itself (claim, run, settle) in this process, and the reaper's counts."""
import logging
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.db import OperationalError, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tenancy import versions
from tenancy.models import Tenant
from tests.tools.support import claim_lock_held_elsewhere
from tools.calls import worker
from tools.calls.submit import call_cancel
from tools.calls.worker import CallWatch, ClaimOutcome, call_claim_limited, calls_reap, worker_run_call
from tools.models import AgentSession, CallStatus, Tool, ToolCall
from tools.python.decorators import CallCancelled, ToolContext
from tools.python.isolation import CallStop

pytestmark = [pytest.mark.django_db(transaction=True)]

START = 100.0  # the watch's clock when it starts


class WatchRests(BaseException):
    """The watch went back to waiting for calls with none left to watch."""


class ScriptEnded(BaseException):
    """The watch slept once more after the last scripted instant."""


class RestingEvent(threading.Event):
    def wait(self, timeout=None):
        if not self.is_set():
            raise WatchRests
        return True


class ScriptedClock:
    """`time` for the worker module: each sleep of the watch moves to the next (instant, action) and runs the
    action there, before the watch looks. Only for the test's thread: the process's own watch, started by an
    earlier test, keeps the real clock (a script's end would kill its thread)."""

    def __init__(self, steps):
        self.now = START
        self.steps = list(steps)
        self.sleeps = []
        self.owner = threading.current_thread()

    def monotonic(self) -> float:
        return self.now if threading.current_thread() is self.owner else time.monotonic()

    def sleep(self, seconds: float) -> None:
        if threading.current_thread() is not self.owner:
            time.sleep(seconds)
            return
        self.sleeps.append(seconds)
        if not self.steps:
            raise ScriptEnded
        self.now, action = self.steps.pop(0)
        if action is not None:
            action()


@pytest.fixture
def watch(monkeypatch):
    """A watch whose thread is the test's own: adding calls starts no other."""
    clock = ScriptedClock([])
    monkeypatch.setattr(worker, "time", SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep))
    watch = CallWatch()
    watch._thread = threading.current_thread()
    watch._has_calls = RestingEvent()
    watch.clock = clock
    return watch


def run(watch, steps) -> str:
    """Run the watch's loop through these steps; how it ended: "rests" or "script ended"."""
    watch.clock.steps = list(steps)
    try:
        watch._run()
    except WatchRests:
        return "rests"
    except ScriptEnded:
        return "script ended"
    raise AssertionError("the watch's loop returned")


def queued(tenant_world, call_id: str, *, tool_name: str = "current_time", tool=None, **fields) -> ToolCall:
    """A call row as the pipeline leaves it for a worker: of the world's tool by that name, or of `tool`."""
    tool = tool or tenant_world.tools[tool_name]
    fields = {"status": CallStatus.QUEUED, **fields}
    return ToolCall.objects.create(tenant=tenant_world.tenant, session=tenant_world.session, call_id=call_id,
                                   tool=tool, tool_name=tool.name, effective_input={}, **fields)


def claimed(tenant_world, call_id: str) -> ToolCall:
    outcome, call = call_claim_limited(call_id=queued(tenant_world, call_id).pk)
    assert outcome == ClaimOutcome.CLAIMED
    return call


def row(call: ToolCall) -> ToolCall:
    return ToolCall.all_tenants.get(pk=call.pk)


def statuses(call: ToolCall) -> list[str]:
    return [e.data["status"] for e in row(call).events.order_by("seq") if e.kind == "status"]


def test_the_watch_renews_every_lease_a_third_of_a_lease_apart(world, watch):
    calls = [claimed(world.a, "a1"), claimed(world.a, "a2"), claimed(world.b, "b1")]
    for call in calls:
        watch.add(call, CallStop(), 600)
    leases = [{call.pk: row(call).lease_until for call in calls}]

    def note():
        leases.append({call.pk: row(call).lease_until for call in calls})

    third = worker.LEASE_S / 3
    assert run(watch, [(START + third - 0.1, None), (START + third, note), (START + 2 * third - 0.1, note),
                       (START + 2 * third, note), (START + 2 * third + 0.1, note)]) == "script ended"
    note()

    def renewed(look: int) -> bool:
        before, after = leases[look], leases[look + 1]
        assert all(after[pk] >= before[pk] for pk in before)
        return all(after[pk] > before[pk] for pk in before)

    assert [renewed(look) for look in range(5)] == [False, True, False, True, False]
    for call in calls:
        lease = row(call).lease_until
        assert timezone.now() + timedelta(seconds=worker.LEASE_S - 5) < lease <= timezone.now() + timedelta(
            seconds=worker.LEASE_S)
        assert row(call).status == CallStatus.RUNNING
    assert watch.clock.sleeps == [worker.WATCH_S] * 6


def test_the_watch_stops_what_was_cancelled_settled_or_deleted_and_keeps_watching_the_rest(world, watch):
    kept, cancelled, settled, deleted, other = (
        claimed(world.a, "kept"), claimed(world.a, "cancelled"), claimed(world.a, "settled"),
        claimed(world.a, "deleted"), claimed(world.b, "other"))
    stops = {call.pk: CallStop() for call in (kept, cancelled, settled, deleted, other)}
    for call in (kept, cancelled, settled, deleted, other):
        watch.add(call, stops[call.pk], 600)
    stopped = []

    def stopped_so_far():
        return {call.call_id for call in (kept, cancelled, settled, deleted, other) if stops[call.pk].is_set()}

    def cancel():
        ToolCall.all_tenants.filter(pk=cancelled.pk).update(cancel_requested=True)

    def settle_and_delete():
        stopped.append(stopped_so_far())
        ToolCall.all_tenants.filter(pk=settled.pk).update(status=CallStatus.SUCCEEDED)
        ToolCall.all_tenants.filter(pk=deleted.pk).delete()

    def noted():
        stopped.append(stopped_so_far())

    def finish_the_rest():
        stopped.append(stopped_so_far())
        watch.remove(kept)  # what each run's own `finally` does
        watch.remove(other)

    assert run(watch, [(START + 1, cancel), (START + 2, settle_and_delete), (START + 3, noted),
                       (START + 4, finish_the_rest)]) == "rests"
    assert stopped == [{"cancelled"}, {"cancelled", "settled", "deleted"}, {"cancelled", "settled", "deleted"}]
    assert not stops[kept.pk].is_set() and not stops[other.pk].is_set()
    assert (row(kept).status, row(other).status, row(settled).status) == (
        CallStatus.RUNNING, CallStatus.RUNNING, CallStatus.SUCCEEDED)
    assert row(cancelled).status == CallStatus.RUNNING  # the run settles it once its tool has stopped


def test_the_watch_rests_once_its_last_call_is_removed_and_only_then(world, watch):
    first, second = claimed(world.a, "first"), claimed(world.a, "second")
    watch.add(first, CallStop(), 600)
    watch.add(second, CallStop(), 600)
    watch.remove(first)
    assert run(watch, [(START + 1, None), (START + 2, lambda: watch.remove(second))]) == "rests"
    assert watch.clock.now == START + 2


def test_the_watch_times_a_call_out_at_its_deadline_exactly(world, watch):
    slow, patient = claimed(world.a, "slow"), claimed(world.a, "patient")
    slow_stop, patient_stop = CallStop(), CallStop()
    watch.add(slow, slow_stop, 2.5)
    watch.add(patient, patient_stop, 600)
    seen = []

    def note():
        seen.append((slow_stop.is_set(), row(slow).status))

    assert run(watch, [(START + 2.4, None), (START + 2.5, note), (START + 2.6, note)]) == "script ended"
    assert seen == [(False, CallStatus.RUNNING), (True, CallStatus.TIMED_OUT)]
    timed_out = row(slow)
    assert timed_out.error["errorType"] == "TimedOut"
    assert timed_out.error["error"] == "the tool did not finish within 2.5 s"
    assert statuses(slow) == [CallStatus.RUNNING, CallStatus.TIMED_OUT]
    assert not patient_stop.is_set() and row(patient).status == CallStatus.RUNNING


def test_a_call_whose_timeout_cannot_be_written_is_stopped_and_the_watch_goes_on(world, watch, monkeypatch,
                                                                                   caplog):
    slow, other = claimed(world.a, "slow"), claimed(world.a, "other")
    slow_stop, other_stop = CallStop(), CallStop()

    def unwritable(**kwargs):
        raise OperationalError("the database went away")

    monkeypatch.setattr(worker, "call_time_out", unwritable)
    watch.add(slow, slow_stop, 1)
    watch.add(other, other_stop, 600)

    def cancel_other():
        assert slow_stop.is_set()
        ToolCall.all_tenants.filter(pk=other.pk).update(cancel_requested=True)

    with caplog.at_level(logging.ERROR, logger="toolkeeper.calls"):
        assert run(watch, [(START + 1, None), (START + 2, cancel_other)]) == "rests"
    assert other_stop.is_set()
    assert row(slow).status == CallStatus.RUNNING
    failures = [record for record in caplog.records if record.name == "toolkeeper.calls"]
    assert [record.getMessage() for record in failures] == ["watching the running calls failed"]
    assert failures[0].exc_info[0] is OperationalError


def test_the_worker_task_claims_runs_and_settles_a_queued_call(world):
    call = queued(world.a, "run")
    assert worker_run_call(call_id=call.pk) == ClaimOutcome.CLAIMED
    done = row(call)
    assert done.status == CallStatus.SUCCEEDED and done.error is None
    assert done.result["structured"]["timezone"] == "UTC" and done.result["state"] == "success"
    assert statuses(call) == [CallStatus.RUNNING, CallStatus.SUCCEEDED]
    assert str(call.pk) not in worker.call_watch._calls
    assert worker_run_call(call_id=call.pk) == ClaimOutcome.GONE
    assert statuses(call) == [CallStatus.RUNNING, CallStatus.SUCCEEDED]


def test_the_worker_task_fails_a_call_whose_tool_was_removed_since_it_was_queued(world):
    call = queued(world.a, "orphan")
    ToolCall.all_tenants.filter(pk=call.pk).update(tool=None)
    assert worker_run_call(call_id=call.pk) == ClaimOutcome.CLAIMED
    failed = row(call)
    assert (failed.status, failed.error["errorType"], failed.error["error"]) == (
        CallStatus.FAILED, "ToolUnavailable", "no executor handles current_time")
    assert statuses(call) == [CallStatus.RUNNING, CallStatus.FAILED]


def test_the_worker_task_has_its_call_timed_out_by_the_watch_at_the_tool_s_timeout(world, watch, make_tool,
                                                                                   monkeypatch):
    """The tool runs until the watch has looked at the instant its timeout ends."""
    monkeypatch.setattr(worker, "call_watch", watch)
    ended = []

    def patient() -> dict:
        """Wait for the watch."""
        ended.append(run(watch, [(START + 2, None)]))
        return {"done": True}

    tool = make_tool(patient, timeout=2)
    call = queued(world.a, "patient", tool=tool)
    assert worker_run_call(call_id=call.pk) == ClaimOutcome.CLAIMED
    assert ended == ["rests"]
    timed_out = row(call)
    assert (timed_out.status, timed_out.error["error"]) == (
        CallStatus.TIMED_OUT, "the tool did not finish within 2 s")


def test_the_worker_task_hands_the_tool_the_stop_its_watch_sets(world, watch, make_tool, monkeypatch):
    """A cancel the watch notices reaches the running tool: the task gives both the same stop."""
    monkeypatch.setattr(worker, "call_watch", watch)
    ended, woken = [], []

    def cancellable(ctx: ToolContext) -> dict:
        """Wait to be cancelled."""

        def cancel() -> None:  # as the API does, from another process
            call_cancel(call=ToolCall.objects.for_tenant(world.a.tenant).get(pk=call.pk))

        ended.append(run(watch, [(START + 1, cancel)]))
        try:
            ctx.sleep(3)  # raises at once once stopped
        except CallCancelled:
            woken.append(True)
            raise
        return {"done": True}

    tool = make_tool(cancellable, timeout=60)
    call = queued(world.a, "cancellable", tool=tool)
    assert worker_run_call(call_id=call.pk) == ClaimOutcome.CLAIMED
    assert ended == ["rests"]
    stopped = row(call)
    assert woken == [True]
    assert (stopped.status, stopped.result["state"]) == (CallStatus.INTERRUPTED, "interrupted")

def test_the_worker_task_reads_the_tenant_s_versions_only_with_its_call(world, monkeypatch):
    """The after-execution steps check their caches against the versions read in the call's own statement."""
    monkeypatch.setattr(versions, "KNOWN_FOR_S", 600.0)
    call = queued(world.a, "known")
    tables = [model._meta.db_table for model in versions.versioned_models()]
    with CaptureQueriesContext(connections["default"]) as queries:
        assert worker_run_call(call_id=call.pk) == ClaimOutcome.CLAIMED
    assert row(call).status == CallStatus.SUCCEEDED
    reading = [n for n, query in enumerate(queries.captured_queries)
               if query["sql"].startswith("SELECT") and any(f'"{table}"' in query["sql"] for table in tables)]
    assert reading == [0]


@pytest.mark.parametrize("status", [CallStatus.RUNNING, CallStatus.CANCELLED])
def test_the_worker_task_leaves_a_call_claimed_or_cancelled_elsewhere(world, status):
    call = queued(world.a, "elsewhere")
    ToolCall.all_tenants.filter(pk=call.pk).update(status=status)
    assert worker_run_call(call_id=call.pk) == ClaimOutcome.GONE
    assert row(call).status == status and statuses(call) == []


def test_the_worker_task_waits_while_the_tenant_is_at_its_cap(world):
    world.a.tenant.max_parallel_calls = 1
    world.a.tenant.save(update_fields=["max_parallel_calls"])
    claimed(world.a, "first")
    call = queued(world.a, "second")
    assert worker_run_call(call_id=call.pk) == ClaimOutcome.WAIT
    assert row(call).status == CallStatus.QUEUED and statuses(call) == []


def test_a_claim_starts_the_lease_when_it_starts_the_call(world):
    call = claimed(world.a, "leased")
    read = row(call)
    assert read.started_at is not None
    assert read.lease_until == read.started_at + timedelta(seconds=worker.LEASE_S)
    assert (call.started_at, call.lease_until) == (read.started_at, read.lease_until)


def test_a_claim_queues_behind_another_claim_of_its_tenant(world):
    if not settings.USING_POSTGRES:
        pytest.skip("the claim lock: PostgreSQL")
    call = queued(world.a, "behind")
    with claim_lock_held_elsewhere(world.a.tenant.pk, lock_timeout="200ms"), \
            pytest.raises(OperationalError, match="lock timeout"):
        call_claim_limited(call_id=call.pk)
    assert row(call).status == CallStatus.QUEUED


def test_a_read_error_on_a_live_connection_is_not_retried(world, monkeypatch):
    call = queued(world.a, "error")
    reads = []

    def failing_read(*args, **kwargs):
        reads.append(kwargs["pk"])
        raise OperationalError("canceling statement due to statement timeout")

    monkeypatch.setattr(worker, "fetch_one", failing_read)
    with pytest.raises(OperationalError, match="statement timeout"):
        call_claim_limited(call_id=call.pk)
    assert reads == [call.pk]


def test_the_reaper_counts_every_call_it_settles(world):
    lapsed = timezone.now() - timedelta(seconds=1)
    for n in range(2):
        queued(world.a, f"idem{n}", status=CallStatus.RUNNING, lease_until=lapsed, attempts=1)
    for n in range(3):
        queued(world.a, f"unsafe{n}", tool_name="slow_write", status=CallStatus.RUNNING, lease_until=lapsed,
               attempts=1)
    assert calls_reap() == {"requeued": 2, "failed": 3}


def test_the_reaper_reads_the_tools_of_lapsed_calls_with_them(world):
    lapsed = timezone.now() - timedelta(seconds=1)
    for n in range(3):
        queued(world.a, f"unsafe{n}", tool_name="slow_write", status=CallStatus.RUNNING, lease_until=lapsed,
               attempts=1)
    tool_table = f'"{ToolCall._meta.get_field("tool").related_model._meta.db_table}"'
    with CaptureQueriesContext(connections["default"]) as queries:
        assert calls_reap() == {"requeued": 0, "failed": 3}
    reading_tools = [n for n, query in enumerate(queries.captured_queries)
                     if query["sql"].startswith("SELECT") and tool_table in query["sql"]]
    assert reading_tools == [0]


def test_a_claim_says_so_when_it_opens_a_lost_connection_again(world, caplog):
    connection = connections["default"]
    call = queued(world.a, "lost")
    connection.ensure_connection()
    backend = connection.connection.info.backend_pid

    def end_it() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [backend])
        finally:
            connections.close_all()

    thread = threading.Thread(target=end_it)
    thread.start()
    thread.join()
    with caplog.at_level(logging.WARNING, logger="toolkeeper.calls"):
        assert call_claim_limited(call_id=call.pk)[0] == ClaimOutcome.CLAIMED
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "toolkeeper.calls"] == [
        ("WARNING", "the database connection was lost between tasks: opening it again")]


def test_a_claim_of_a_call_that_is_gone_is_gone(world):
    call = queued(world.a, "deleted")
    ToolCall.all_tenants.filter(pk=call.pk).delete()
    assert call_claim_limited(call_id=call.pk) == (ClaimOutcome.GONE, None)


def test_a_claim_reads_the_call_with_its_session_tool_and_tenant_in_its_first_statement(world):
    call = queued(world.a, "joined")
    with CaptureQueriesContext(connections["default"]) as queries:
        outcome, claimed_call = call_claim_limited(call_id=call.pk)
    assert outcome == ClaimOutcome.CLAIMED
    tables = [model._meta.db_table for model in (AgentSession, Tool, Tenant)]
    reading = [n for n, query in enumerate(queries.captured_queries)
               if query["sql"].startswith("SELECT") and any(f'"{table}"' in query["sql"] for table in tables)]
    assert reading == [0]
