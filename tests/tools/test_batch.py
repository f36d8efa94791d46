"""Batches and the local executor (docs/calls.md): order, per-session serialisation, the tenant's cap,
timeouts, cancellation, waiting and events. Calls really run, so these tests are transactional."""
import threading

import pytest

from tenancy.models import Tenant
from tests.tools.support import poll, wait_status, wait_terminal
from tools.calls import submit as calls_module
from tools.calls.runtime import runtime
from tools.catalog.services import session_create
from tools.models import AgentSession, CallEvent, CallStatus, Tool, ToolCall, ToolGroup
from tools.python.decorators import CallCancelled, ToolContext

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]


class Gauge:
    """Counts the instances of a tool running at once. Each instance waits (bounded) for `target` peers."""

    def __init__(self, target: int, hold: float, linger: float = 0.0):
        self.cond = threading.Condition()
        self.running = 0
        self.max = 0
        self.starts: list[str] = []
        self.target = target
        self.hold = hold
        self.linger = linger

    def run(self, tag: str, ctx: ToolContext) -> str:
        with self.cond:
            self.running += 1
            self.max = max(self.max, self.running)
            self.starts.append(tag)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.max >= self.target, timeout=self.hold)
        try:
            if self.linger:
                ctx.sleep(self.linger)
        finally:
            with self.cond:
                self.running -= 1
        return tag


def gauge_tool(make_tool, gauge: Gauge, prefix: str, **options) -> Tool:
    def gauged(tag: str, ctx: ToolContext) -> str:
        """Run under a gauge.

        Args:
            tag: A label.
        """
        return gauge.run(tag, ctx)

    return make_tool(gauged, prefix=prefix, **options)


def submit(client, session, body):
    response = client.post(f"/api/v1/sessions/{session.pk}/calls", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["calls"]


@pytest.fixture
def session(world):
    return session_create(tenant=world.a.tenant, agent="batcher")


def test_results_in_request_order(world, make_tool, session):
    release = threading.Event()

    def slow(ctx: ToolContext) -> str:
        """Slow until released."""
        release.wait(5)
        return "slow"

    def fast() -> str:
        """Fast."""
        release.set()
        return "fast"

    slow_tool = make_tool(slow)
    fast_tool = make_tool(fast)
    calls = submit(world.a.client(), session, {"calls": [
        {"name": slow_tool.name},
        {"id": "mine", "name": fast_tool.name},
        {"name": "no_such_tool"},
        {"name": "reset_tools", "input": {"math": True}},
        {"name": "current_time", "input": {"timezone": "UTC"}},
    ], "wait": 10})
    assert [c["tool"] for c in calls] == [slow_tool.name, fast_tool.name, "no_such_tool", "reset_tools",
                                          "current_time"]
    ids = [c["call_id"] for c in calls]
    assert ids[1] == "mine"
    assert len(set(ids)) == 5 and all(i.startswith("call_") for i in ids[:1] + ids[2:])
    assert [c["status"] for c in calls] == ["succeeded", "succeeded", "failed", "succeeded", "succeeded"]
    assert calls[0]["result"]["content"][0]["text"] == "slow"
    assert calls[1]["result"]["content"][0]["text"] == "fast"
    assert all(c["session"] == str(session.pk) for c in calls)


def test_unsafe_tool_runs_one_at_a_time_per_session_in_arrival_order(world, make_tool, session):
    gauge = Gauge(target=2, hold=0.25)  # each instance waits a moment for a peer that must never come
    tool = gauge_tool(make_tool, gauge, "unsafe", concurrency_safe=False)
    calls = submit(world.a.client(), session, {"calls": [
        {"name": tool.name, "input": {"tag": str(i)}} for i in range(3)
    ], "wait": 10})
    for call in calls:
        assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.SUCCEEDED
    assert gauge.max == 1
    assert gauge.starts == ["0", "1", "2"]


def test_unsafe_tool_may_run_in_parallel_across_sessions(world, make_tool):
    gauge = Gauge(target=2, hold=5)
    tool = gauge_tool(make_tool, gauge, "unsafe", concurrency_safe=False)
    client = world.a.client()
    first = session_create(tenant=world.a.tenant, agent="one")
    second = session_create(tenant=world.a.tenant, agent="two")
    calls = submit(client, first, {"name": tool.name, "input": {"tag": "a"}})
    calls += submit(client, second, {"name": tool.name, "input": {"tag": "b"}})
    for call in calls:
        wait_terminal(call["id"], tenant=world.a.tenant)
    assert gauge.max == 2


def test_safe_tools_run_in_parallel(world, make_tool, session):
    gauge = Gauge(target=3, hold=5)
    tool = gauge_tool(make_tool, gauge, "safe")
    calls = submit(world.a.client(), session, {"calls": [
        {"name": tool.name, "input": {"tag": str(i)}} for i in range(3)
    ], "wait": 10})
    assert [c["status"] for c in calls] == ["succeeded"] * 3
    assert gauge.max == 3


def test_tenant_parallel_cap(world, make_tool, session):
    Tenant.objects.filter(pk=world.a.tenant.pk).update(max_parallel_calls=2)
    gauge = Gauge(target=2, hold=5, linger=0.1)  # pairs form, then linger so a third would overlap them
    tool = gauge_tool(make_tool, gauge, "capped")
    calls = submit(world.a.client(), session, {"calls": [
        {"name": tool.name, "input": {"tag": str(i)}} for i in range(6)
    ], "wait": 10})
    for call in calls:
        assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.SUCCEEDED
    assert gauge.max == 2


def test_timeout_gives_timed_out_with_a_structured_error(world, make_tool, session):
    woken = threading.Event()

    def sleepy(ctx: ToolContext) -> str:
        """Sleep far longer than the timeout."""
        try:
            ctx.sleep(10)
        except CallCancelled:
            woken.set()
            raise
        return "overslept"

    tool = make_tool(sleepy, timeout=0.5)
    [call] = submit(world.a.client(), session, {"id": "slow", "name": tool.name, "wait": 10})
    call = wait_terminal(call["id"], tenant=world.a.tenant)
    assert call.status == CallStatus.TIMED_OUT
    assert call.error["errorType"] == "TimedOut"
    assert call.error["tool"] == tool.name and call.error["callId"] == "slow"
    assert "0.5" in call.error["error"]
    assert call.result["state"] == "error"
    assert call.finished_at is not None
    poll(woken.is_set, message="the tool to be woken by the timeout")
    detail = world.a.client().get(f"/api/v1/calls/{call.pk}").json()
    assert detail["status"] == "timed_out"
    assert detail["error"]["errorType"] == "TimedOut"


def test_cancel_of_a_running_call_interrupts_and_wakes_the_tool(world, make_tool, session):
    started = threading.Event()
    woken = threading.Event()

    def blocking(ctx: ToolContext) -> str:
        """Block until cancelled."""
        started.set()
        try:
            ctx.sleep(10)
        except CallCancelled:
            woken.set()
            raise
        return "not cancelled"

    tool = make_tool(blocking)
    client = world.a.client()
    [call] = submit(client, session, {"name": tool.name})
    wait_status(call["id"], CallStatus.RUNNING, tenant=world.a.tenant)
    poll(started.is_set, message="the tool to start")
    response = client.post(f"/api/v1/calls/{call['id']}/cancel")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "interrupted"
    poll(woken.is_set, message="ctx.sleep to raise")
    final = wait_terminal(call["id"], tenant=world.a.tenant)
    assert final.status == CallStatus.INTERRUPTED
    assert final.result["state"] == "interrupted"
    again = client.post(f"/api/v1/calls/{call['id']}/cancel")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "conflict"


def test_cancel_of_a_finished_call_is_409(world, session):
    client = world.a.client()
    [call] = submit(client, session, {"name": "current_time", "wait": 10})
    assert call["status"] == "succeeded"
    response = client.post(f"/api/v1/calls/{call['id']}/cancel")
    assert response.status_code == 409
    assert set(response.json()["error"]) == {"code", "message", "fields"}
    assert "succeeded" in response.json()["error"]["message"]
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=call["id"]).status == CallStatus.SUCCEEDED


def test_wait_returns_settled_statuses(world, make_tool, session):
    def quick(ctx: ToolContext) -> str:
        """Takes a moment."""
        ctx.sleep(0.2)
        return "done"

    tool = make_tool(quick)
    external = Tool.objects.create(tenant=world.a.tenant, name="ext_lookup", source="external",
                                   input_schema={"type": "object", "properties": {}})
    ToolGroup.objects.for_tenant(world.a.tenant).get(name="basic").tools.add(external)
    calls = submit(world.a.client(), session, {"calls": [{"name": tool.name}, {"name": "ext_lookup"}], "wait": 10})
    assert [c["status"] for c in calls] == ["succeeded", "awaiting_external"]
    assert calls[0]["result"] == {"state": "success", "content": [{"type": "text", "text": "done"}],
                                  "structured": None}
    assert calls[0]["finished_at"] is not None


def test_without_wait_the_call_is_returned_at_once(world, make_tool, session):
    release = threading.Event()

    def held() -> str:
        """Held until released."""
        release.wait(5)
        return "released"

    tool = make_tool(held)
    [call] = submit(world.a.client(), session, {"name": tool.name})
    assert call["status"] in ("queued", "running")
    assert call["result"] is None
    release.set()
    assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.SUCCEEDED


def test_call_detail_wait(world, make_tool, session):
    release = threading.Event()

    def held() -> str:
        """Held until released."""
        release.wait(5)
        return "released"

    tool = make_tool(held)
    client = world.a.client()
    [call] = submit(client, session, {"name": tool.name})
    wait_status(call["id"], CallStatus.RUNNING, tenant=world.a.tenant)
    short = client.get(f"/api/v1/calls/{call['id']}", {"wait": 0.2})
    assert short.status_code == 200
    assert short.json()["status"] == "running"  # not terminal yet: answered when the wait ran out
    releaser = threading.Timer(0.3, release.set)
    releaser.start()
    try:
        long = client.get(f"/api/v1/calls/{call['id']}", {"wait": 10})
    finally:
        releaser.join()
    assert long.status_code == 200
    assert long.json()["status"] == "succeeded"
    assert long.json()["result"]["content"][0]["text"] == "released"


def test_events_with_after(world, make_tool, session):
    def chatty(ctx: ToolContext) -> str:
        """Report progress."""
        ctx.emit("half", progress=0.5)
        ctx.emit("some output")
        return "ok"

    tool = make_tool(chatty)
    client = world.a.client()
    [call] = submit(client, session, {"name": tool.name, "wait": 10})
    assert call["status"] == "succeeded"
    events = client.get(f"/api/v1/calls/{call['id']}/events").json()["events"]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(events) + 1))
    assert [e["data"].get("status") for e in events if e["kind"] == "status"] == ["queued", "running", "succeeded"]
    progress = [e for e in events if e["kind"] == "progress"]
    assert progress == [{"seq": progress[0]["seq"], "kind": "progress", "data": {"text": "half", "progress": 0.5},
                         "at": progress[0]["at"]}]
    assert any(e["kind"] == "output" and e["data"]["text"] == "some output" for e in events)
    later = client.get(f"/api/v1/calls/{call['id']}/events", {"after": 2}).json()["events"]
    assert [e["seq"] for e in later] == seqs[2:]
    assert client.get(f"/api/v1/calls/{call['id']}/events", {"after": seqs[-1]}).json()["events"] == []


def test_cancel_of_a_queued_call_means_it_never_runs(world, make_tool, session):
    Tenant.objects.filter(pk=world.a.tenant.pk).update(max_parallel_calls=1)
    release = threading.Event()
    ran = []

    def gate(tag: str) -> str:
        """Wait for the gate.

        Args:
            tag: A label.
        """
        ran.append(tag)
        release.wait(5)
        return tag

    tool = make_tool(gate)
    client = world.a.client()
    first, second = submit(client, session, {"calls": [{"name": tool.name, "input": {"tag": "first"}},
                                                       {"name": tool.name, "input": {"tag": "second"}}]})
    wait_status(first["id"], CallStatus.RUNNING, tenant=world.a.tenant)
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=second["id"]).status == CallStatus.QUEUED
    response = client.post(f"/api/v1/calls/{second['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert response.json()["result"]["state"] == "interrupted"
    release.set()
    assert wait_terminal(first["id"], tenant=world.a.tenant).status == CallStatus.SUCCEEDED
    assert wait_terminal(second["id"], tenant=world.a.tenant).status == CallStatus.CANCELLED
    # the executor has dropped it: once idle, the cancelled call has still not run
    executor = runtime().executor

    def idle():
        with executor._lock:
            return not executor._running and not executor._waiting

    poll(idle, message="the executor to be idle")
    assert ran == ["first"]


def _executor_idle():
    executor = runtime().executor
    with executor._lock:
        return not executor._running and not executor._waiting


def test_a_late_result_never_overwrites_a_timeout(world, make_tool, session):
    release = threading.Event()
    finished = threading.Event()

    def stubborn() -> str:
        """Ignores the context: cannot be woken."""
        release.wait(5)
        finished.set()
        return "too late"

    tool = make_tool(stubborn, timeout=0.3)
    [call] = submit(world.a.client(), session, {"name": tool.name})
    wait_status(call["id"], CallStatus.TIMED_OUT, tenant=world.a.tenant)
    release.set()
    poll(finished.is_set, message="the tool to return")
    poll(_executor_idle, message="the executor to be idle")
    final = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call["id"])
    assert final.status == CallStatus.TIMED_OUT
    assert final.error["errorType"] == "TimedOut"
    assert final.result["state"] == "error"


def test_a_late_result_never_overwrites_a_cancel(world, make_tool, session):
    started = threading.Event()
    release = threading.Event()
    finished = threading.Event()

    def stubborn() -> str:
        """Ignores the context: cannot be woken."""
        started.set()
        release.wait(5)
        finished.set()
        return "too late"

    tool = make_tool(stubborn)
    client = world.a.client()
    [call] = submit(client, session, {"name": tool.name})
    poll(started.is_set, message="the tool to start")
    assert client.post(f"/api/v1/calls/{call['id']}/cancel").json()["status"] == "interrupted"
    release.set()
    poll(finished.is_set, message="the tool to return")
    poll(_executor_idle, message="the executor to be idle")
    final = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call["id"])
    assert final.status == CallStatus.INTERRUPTED
    assert final.result["state"] == "interrupted"
    statuses = [e["data"]["status"] for e in client.get(f"/api/v1/calls/{call['id']}/events").json()["events"]
                if e["kind"] == "status"]
    assert statuses == ["queued", "running", "interrupted"]


def test_one_tenant_at_its_cap_does_not_hold_up_another(world, make_tool, session):
    Tenant.objects.filter(pk=world.a.tenant.pk).update(max_parallel_calls=1)
    release = threading.Event()

    def gate() -> str:
        """Wait for the gate."""
        release.wait(5)
        return "through"

    tool = make_tool(gate)
    try:
        a_calls = submit(world.a.client(), session, {"calls": [{"name": tool.name}, {"name": "current_time"}]})
        wait_status(a_calls[0]["id"], CallStatus.RUNNING, tenant=world.a.tenant)
        b_session = session_create(tenant=world.b.tenant, agent="other-tenant")
        [b_call] = submit(world.b.client(), b_session, {"name": "current_time", "wait": 10})
        assert b_call["status"] == "succeeded"  # while A's second call still waits for A's only slot
        assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=a_calls[1]["id"]).status == CallStatus.QUEUED
    finally:
        release.set()
    for call in a_calls:
        assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.SUCCEEDED


def test_a_call_that_may_start_at_once_is_claimed_by_its_own_request(world, session):
    """Its row, `queued` and `running` are written by the request's transaction; the run writes the result."""
    [call] = submit(world.a.client(), session, {"name": "current_time", "input": {}})
    assert call["status"] == "running"  # as the request's own transaction left it
    assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.SUCCEEDED
    row = ToolCall.objects.for_tenant(world.a.tenant).get(pk=call["id"])
    assert row.attempts == 1 and row.started_at is not None
    events = list(CallEvent.objects.for_tenant(world.a.tenant).filter(call=row).order_by("seq"))
    assert [(event.seq, event.data.get("status")) for event in events] == [
        (1, "queued"), (2, "running"), (3, "succeeded")]


def test_a_submission_that_does_not_commit_gives_back_the_places_it_claimed(world, make_tool, session, monkeypatch):
    """With a cap of one: the first call of a batch takes the tenant's only place, the second call's chain
    fails and the batch rolls back. The place is free again: the next call is claimed and runs."""
    Tenant.objects.filter(pk=world.a.tenant.pk).update(max_parallel_calls=1)
    executor = runtime().executor
    real_run = calls_module.pipeline_run
    runs = []

    def second_fails(ctx, **kwargs):
        runs.append(ctx.call.call_id)
        if len(runs) == 2:
            raise RuntimeError("the chain broke")
        return real_run(ctx, **kwargs)

    monkeypatch.setattr(calls_module, "pipeline_run", second_fails)
    session = AgentSession.objects.for_tenant(world.a.tenant).get(pk=session.pk)  # with the tenant's new cap
    with pytest.raises(RuntimeError):
        calls_module.calls_submit(session=session, calls=[{"name": "current_time", "input": {}},
                                                          {"name": "current_time", "input": {}}])
    assert len(runs) == 2
    assert not ToolCall.objects.for_tenant(world.a.tenant).filter(session=session).exists()
    with executor._lock:
        assert executor._running_per_tenant[world.a.tenant.pk] == 0
        assert not executor._running
    monkeypatch.setattr(calls_module, "pipeline_run", real_run)
    [call] = calls_module.calls_submit(session=session, calls=[{"name": "current_time", "input": {}}])
    assert call.status == CallStatus.RUNNING  # claimed at once: the place was given back
    assert wait_terminal(call.pk, tenant=world.a.tenant).status == CallStatus.SUCCEEDED


def test_a_failed_call_whose_generated_id_was_taken_names_the_id_it_got(world, session):
    """The session's second generated id (`call_2`) was taken by an explicit one: the call gets `call_3`, and
    the error the model reads names that id, not the one first tried."""
    client = world.a.client()
    submit(client, session, {"id": "call_2", "name": "current_time", "input": {}})
    [failed] = submit(client, session, {"name": "no_such_tool", "input": {}})
    assert failed["call_id"] == "call_3"
    row = ToolCall.objects.for_tenant(world.a.tenant).get(pk=failed["id"])
    assert row.error["callId"] == "call_3"
    event = CallEvent.objects.for_tenant(world.a.tenant).get(call=row, seq=1)
    assert event.data["error"]["callId"] == "call_3"
