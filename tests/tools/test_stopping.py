"""A runaway tool is stopped at its timeout or cancellation without stalling other tenants' calls:
thread-run tools by an exception at their next instruction, process-run tools by killing their process.
Calls really run through the local executor, so these tests are transactional."""
import os
import threading

import pytest

from tests.distributed.stack import process_gone
from tests.tools import isolated_tools
from tests.tools.support import events_of, poll, submit, wait_status, wait_terminal
from tools.calls import executors
from tools.calls.runtime import runtime
from tools.catalog.services import session_create
from tools.models import CallStatus
from tools.python.decorators import ToolContext

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]


def other_tenants_calls_succeed(world, count: int = 3) -> None:
    session = session_create(tenant=world.b.tenant, agent="neighbour")
    calls = submit(world.b.client(), session, {"calls": [
        {"name": "current_time", "input": {"timezone": "UTC"}} for _ in range(count)], "wait": 30})
    assert [c["status"] for c in calls] == ["succeeded"] * count, calls


@pytest.fixture
def session(world):
    return session_create(tenant=world.a.tenant, agent="runaway")


@pytest.fixture
def one_worker(monkeypatch):
    """The local executor with a single worker thread: a thread never freed would block every later call."""
    executor = executors.LocalExecutor(1)
    monkeypatch.setattr(runtime(), "executor", executor)
    yield executor
    executor._pool.shutdown(wait=False)


@pytest.fixture
def isolated(make_tool):
    """Register module-level functions as process-run tools in tenant A's `basic` group."""
    return lambda fn, **options: make_tool(fn, isolation="process", **options)


@pytest.mark.stops_threads
class TestThreads:
    def test_a_spinning_tool_is_stopped_at_its_timeout_and_its_thread_serves_the_next_call(
            self, world, make_tool, session, one_worker):
        left = threading.Event()

        def spin() -> str:
            """Never return."""
            try:
                while True:
                    pass
            finally:
                left.set()

        [call] = submit(world.a.client(), session, {"name": make_tool(spin, timeout=1).name})
        final = wait_terminal(call["id"], tenant=world.a.tenant)
        assert final.status == CallStatus.TIMED_OUT
        assert final.error["errorType"] == "TimedOut"
        poll(left.is_set, message="the spinning tool to be stopped")
        other_tenants_calls_succeed(world)  # on the single worker thread the spinning tool held

    def test_other_tenants_calls_complete_while_a_tool_spins_and_a_cancel_stops_it(
            self, world, make_tool, session):
        started, left = threading.Event(), threading.Event()

        def spin() -> str:
            """Never return."""
            started.set()
            try:
                while True:
                    pass
            finally:
                left.set()

        client = world.a.client()
        [call] = submit(client, session, {"name": make_tool(spin, timeout=600).name})
        poll(started.is_set, message="the tool to start")
        other_tenants_calls_succeed(world)
        assert wait_status(call["id"], CallStatus.RUNNING, tenant=world.a.tenant)  # still spinning meanwhile
        assert client.post(f"/api/v1/calls/{call['id']}/cancel").json()["status"] == "interrupted"
        poll(left.is_set, message="the cancelled tool to be stopped")
        assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.INTERRUPTED

    def test_a_tool_that_swallows_the_stop_is_stopped_again(self, world, make_tool, session, one_worker):
        swallowed, left = threading.Event(), threading.Event()

        def stubborn() -> str:
            """Swallow the first stop, then spin on."""
            try:
                try:
                    while True:
                        pass
                except BaseException:  # noqa: BLE001 (what a careless tool does)
                    swallowed.set()
                while True:
                    pass
            finally:
                left.set()

        [call] = submit(world.a.client(), session, {"name": make_tool(stubborn, timeout=1).name})
        assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.TIMED_OUT
        poll(left.is_set, message="the stubborn tool to be stopped")
        assert swallowed.is_set()
        other_tenants_calls_succeed(world)

    def test_a_stop_never_lands_in_the_context_and_the_tool_database_work_is_reset(
            self, world, make_tool, session, one_worker):
        left = threading.Event()

        def busy(ctx: ToolContext) -> str:
            """Loop over database work of its own."""
            try:
                while True:
                    ctx.tenant.refresh_from_db()
            finally:
                left.set()

        [call] = submit(world.a.client(), session, {"name": make_tool(busy, timeout=1).name})
        assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.TIMED_OUT
        poll(left.is_set, message="the busy tool to be stopped")
        # The same worker thread still writes: its connection was replaced, no lock was left behind.
        other_tenants_calls_succeed(world)


class TestProcesses:
    def test_a_tool_holding_the_gil_in_its_process_is_killed_at_its_timeout(self, world, isolated, session):
        client = world.a.client()
        # A first call readies a child and its imports (children are reused, the last used first), so the
        # timeout below covers the computation, not the child's start.
        [warm] = submit(client, session, {"name": isolated(isolated_tools.process_id).name, "wait": 60})
        assert warm["status"] == "succeeded", warm
        power = isolated(isolated_tools.huge_power, timeout=3)
        [call] = submit(client, session, {"name": power.name, "input": {"exponent": 10**8}})
        events = poll(lambda: [e for e in events_of(client, call["id"]) if e["kind"] == "output"],
                      message="the tool to report its process")
        pid = int(events[0]["data"]["text"])
        assert pid != os.getpid()
        final = wait_terminal(call["id"], tenant=world.a.tenant)
        assert final.status == CallStatus.TIMED_OUT
        assert final.error["errorType"] == "TimedOut"
        poll(lambda: process_gone(pid), message="the tool's process to be killed")

    def test_other_tenants_calls_complete_while_a_process_tool_computes(self, world, isolated, session):
        power = isolated(isolated_tools.huge_power, timeout=600)
        client = world.a.client()
        [call] = submit(client, session, {"name": power.name, "input": {"exponent": 10**8}})
        events = poll(lambda: [e for e in events_of(client, call["id"]) if e["kind"] == "output"],
                      message="the tool to start computing")
        other_tenants_calls_succeed(world)
        assert wait_status(call["id"], CallStatus.RUNNING, tenant=world.a.tenant)  # still computing meanwhile
        assert client.post(f"/api/v1/calls/{call['id']}/cancel").json()["status"] == "interrupted"
        poll(lambda: process_gone(int(events[0]["data"]["text"])), message="the tool's process to be killed")
        assert wait_terminal(call["id"], tenant=world.a.tenant).status == CallStatus.INTERRUPTED
        # The pool replaced the child: the next process-run call works.
        who = isolated(isolated_tools.process_id)
        [after] = submit(client, session, {"name": who.name, "wait": 30})
        assert after["status"] == "succeeded", after

    def test_the_context_in_a_process(self, world, isolated, session):
        who = isolated(isolated_tools.process_id)
        [call] = submit(world.a.client(), session, {"id": "where", "name": who.name, "wait": 30})
        assert call["status"] == "succeeded", call
        found = call["result"]["structured"]
        assert found["pid"] != os.getpid()
        assert found == {"pid": found["pid"], "call_id": "where", "agent": "runaway", "tenant": None,
                         "cancelled": False}

    def test_generators_and_coroutines_run_in_a_process_too(self, world, isolated, session):
        client = world.a.client()
        squares = isolated(isolated_tools.squares)
        greeting = isolated(isolated_tools.async_greeting)
        streamed, greeted = submit(client, session, {"calls": [
            {"name": squares.name, "input": {"count": 3}},
            {"name": greeting.name, "input": {"name": "Ada"}},
        ], "wait": 30})
        assert streamed["status"] == "succeeded", streamed
        assert streamed["result"]["structured"] == [{"n": 1, "square": 1}, {"n": 2, "square": 4},
                                                    {"n": 3, "square": 9}]
        events = events_of(client, streamed["id"])
        assert [(e["kind"], e["data"]) for e in events if e["kind"] != "status"] == [
            ("progress", {"text": "starting", "progress": 0.0}),
            ("output", {"text": '{"n": 1, "square": 1}'}),
            ("output", {"text": '{"n": 2, "square": 4}'}),
            ("output", {"text": '{"n": 3, "square": 9}'}),
        ]
        assert greeted["status"] == "succeeded", greeted
        text = greeted["result"]["content"][0]["text"]
        assert text.startswith("hello Ada from ") and int(text.rsplit(" ", 1)[1]) != os.getpid()
        assert [e["data"]["text"] for e in events_of(client, greeted["id"]) if e["kind"] == "output"] == [
            "greeting Ada"]

    def test_failures_in_a_process_are_structured_errors(self, world, isolated, session):
        client = world.a.client()
        refuses = isolated(isolated_tools.refuses)
        crashes = isolated(isolated_tools.crashes)
        database = isolated(isolated_tools.reads_the_database)
        invalid, refused, crashed, no_database = submit(client, session, {"calls": [
            {"name": refuses.name, "input": {"reason": 3}},
            {"name": refuses.name, "input": {"reason": "not today"}},
            {"name": crashes.name},
            {"name": database.name},
        ], "wait": 30})
        assert (invalid["status"], invalid["error"]["errorType"]) == ("failed", "InvalidInput")
        assert (refused["status"], refused["error"]["errorType"]) == ("failed", "Refused")
        assert refused["error"]["error"] == "not today"
        assert (crashed["status"], crashed["error"]["errorType"]) == ("failed", "ToolFailed")
        assert "process ended" in crashed["error"]["error"]
        assert (no_database["status"], no_database["error"]["errorType"]) == ("failed", "ToolFailed")
        assert "no database" in no_database["error"]["error"]

