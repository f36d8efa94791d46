"""One runtime per mode owns the executor, the waiter, the periodic jobs and start-up recovery; the
mode is decided in settings, and the executor is the class settings name."""
import json
import os
import subprocess
import sys
import time

import pytest
from celery import Celery
from django.test import override_settings

from tests.tools.support import wait_terminal
from tools.calls import runtime as runtime_module
from tools.calls.executors import CeleryExecutor, LocalExecutor
from tools.calls.runtime import DistributedRuntime, EmbeddedRuntime, runtime
from tools.calls.submit import call_cancel, calls_submit
from tools.calls.waiting import ChannelLayerWaiter, InProcessWaiter
from tools.catalog.registry import periodic_jobs
from tools.catalog.services import session_create
from tools.models import CallEvent, CallStatus, ToolCall
from tools.python.decorators import ToolContext

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = ("import json, sys; sys.path[:0] = ['platform', '.']; from toolkeeper import settings as s;"
         "print(json.dumps([s.TOOLKEEPER_RUNTIME, s.TOOLKEEPER_EXECUTOR_CLASS]))")


class RecordingExecutor:
    """An executor that only notes what it is handed."""

    def __init__(self):
        self.submitted: list[str] = []
        self.cancelled: list[str] = []

    def queued_fields(self) -> dict:
        return {}

    def submit(self, call, *, stamped: bool = False) -> bool:
        self.submitted.append(str(call.pk))
        return True

    def cancel(self, call_id) -> None:
        self.cancelled.append(str(call_id))


RECORDING = f"{__name__}.RecordingExecutor"


@pytest.fixture
def use_runtime(monkeypatch):
    """Make this process's runtime a new one of `runtime_path`, with the executor `executor_path`."""
    made = []

    def use(runtime_path: str, executor_path: str):
        overriding = override_settings(TOOLKEEPER_RUNTIME=runtime_path, TOOLKEEPER_EXECUTOR_CLASS=executor_path)
        overriding.enable()
        made.append(overriding)
        monkeypatch.setattr(runtime_module, "_runtime", None)
        return runtime()

    yield use
    for overriding in made:
        current = runtime_module._runtime
        executor = current._executor if current is not None else None
        if isinstance(executor, LocalExecutor):  # let its threads finish before the tables are flushed
            deadline = time.monotonic() + 10
            while executor._running or executor._waiting:
                assert time.monotonic() < deadline, "the executor did not become idle"
                time.sleep(0.02)
        overriding.disable()


@pytest.mark.parametrize(("env", "expected"), [
    ({}, ["tools.calls.runtime.EmbeddedRuntime", "tools.calls.executors.LocalExecutor"]),
    ({"TOOLKEEPER_EXECUTOR": "celery", "REDIS_URL": "redis://r.example:6379/0"},
     ["tools.calls.runtime.DistributedRuntime", "tools.calls.executors.CeleryExecutor"]),
])
def test_settings_derive_the_runtime_and_its_executor_from_the_mode(tmp_path, env, expected):
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "TOOLKEEPER_EXECUTOR"}}
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True,
                            env={**clean, "TOOLKEEPER_DATA_DIR": str(tmp_path), **env})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == expected


def test_calls_go_to_the_executor_class_that_settings_name(world, use_runtime, django_capture_on_commit_callbacks):
    executor = use_runtime("tools.calls.runtime.EmbeddedRuntime", RECORDING).executor
    assert isinstance(executor, RecordingExecutor)
    session = session_create(tenant=world.a.tenant, agent="recorded")
    with django_capture_on_commit_callbacks(execute=True):
        [call] = calls_submit(session=session, calls=[{"name": "current_time", "input": {"timezone": "UTC"}}])
    assert call.status == CallStatus.QUEUED
    assert executor.submitted == [str(call.pk)]
    with django_capture_on_commit_callbacks(execute=True):
        call_cancel(call=call)
    assert executor.cancelled == [str(call.pk)]


def test_each_mode_has_its_own_waiter_and_periodic_jobs(use_runtime):
    embedded = use_runtime("tools.calls.runtime.EmbeddedRuntime", "tools.calls.executors.LocalExecutor")
    assert isinstance(embedded, EmbeddedRuntime) and isinstance(embedded.waiter, InProcessWaiter)
    assert embedded.periodic_jobs() == periodic_jobs()  # what the apps registered, run by its timer

    distributed = use_runtime("tools.calls.runtime.DistributedRuntime", "tools.calls.executors.CeleryExecutor")
    assert isinstance(distributed, DistributedRuntime) and isinstance(distributed.waiter, ChannelLayerWaiter)
    assert isinstance(distributed.executor, CeleryExecutor)
    jobs = distributed.periodic_jobs()
    assert {"tools.reap", "tools.dispatch_pending", "approvals.expire"} <= set(jobs)
    assert set(periodic_jobs()) < set(jobs)  # recovery is its own periodic work

    beat = Celery("probe", set_as_current=False)
    distributed.beat_schedule(beat)
    schedule = beat.conf.beat_schedule
    assert set(schedule) == set(jobs)
    assert {entry["task"] for entry in schedule.values()} == {"tools.periodic"}
    assert all(entry["args"] == (name,) for name, entry in schedule.items())


@pytest.mark.django_db(transaction=True)
def test_the_embedded_runtime_takes_over_what_a_stopped_process_left(world, use_runtime, make_tool):
    executor = use_runtime("tools.calls.runtime.EmbeddedRuntime", RECORDING).executor

    def once() -> str:
        """Not idempotent."""
        return "ran"

    def again() -> str:
        """Idempotent."""
        return "ran"

    not_idempotent = make_tool(once)
    idempotent = make_tool(again, idempotent=True)
    session = session_create(tenant=world.a.tenant, agent="restarted")
    queued, lost, rerun = calls_submit(session=session, calls=[
        {"name": "current_time", "input": {"timezone": "UTC"}},
        {"name": not_idempotent.name, "input": {}},
        {"name": idempotent.name, "input": {}},
    ])
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk__in=[lost.pk, rerun.pk]).update(status=CallStatus.RUNNING)
    executor.submitted.clear()

    assert runtime().calls_recover() == {"requeued": 2, "interrupted": 1}

    assert sorted(executor.submitted) == sorted([str(queued.pk), str(rerun.pk)])
    lost = ToolCall.objects.for_tenant(world.a.tenant).get(pk=lost.pk)
    assert lost.status == CallStatus.FAILED and lost.error["errorType"] == "WorkerLost"
    status = CallEvent.objects.for_tenant(world.a.tenant).filter(call=lost, kind="status").order_by("seq").last()
    assert status.data["error"] == lost.error  # a failure's status event carries its error
    assert ToolCall.objects.for_tenant(world.a.tenant).get(pk=rerun.pk).status == CallStatus.QUEUED


class NotingChannelLayerWaiter(ChannelLayerWaiter):
    def __init__(self):
        self.waited: list[set] = []

    async def settled(self, plan, watch, stop):
        self.waited.append(plan.pending())
        return await super().settled(plan, watch, stop)


@pytest.mark.django_db(transaction=True)
def test_a_request_waits_through_the_waiter_of_the_runtime(world, use_runtime, make_tool):
    """The distributed runtime's waiter listens on the channel layer; here the calls run on local threads,
    so the mode's parts are separate: the view only declares what it waits for."""
    distributed = use_runtime("tools.calls.runtime.DistributedRuntime", "tools.calls.executors.LocalExecutor")
    distributed.waiter = NotingChannelLayerWaiter()

    def pause(ctx: ToolContext) -> str:
        """Wait a little, so the request has to wait."""
        ctx.sleep(0.2)
        return "done"

    tool = make_tool(pause)
    session = session_create(tenant=world.a.tenant, agent="waiting")
    response = world.a.client().post(f"/api/v1/sessions/{session.pk}/calls",
                                     {"calls": [{"name": tool.name, "input": {}}], "wait": 10}, format="json")
    assert response.status_code == 200, response.content
    [call] = response.json()["calls"]
    assert call["status"] == "succeeded" and call["result"]["content"][0]["text"] == "done"
    assert distributed.waiter.waited == [{call["id"]}]
    wait_terminal(call["id"], tenant=world.a.tenant)


def test_background_jobs_run_in_daemon_threads_and_a_waiting_one_is_not_queued_twice():
    import threading

    from tools.catalog.registry import register_background

    started, release, counted = threading.Semaphore(0), threading.Event(), []

    def block(n):
        started.release()
        release.wait(10)

    register_background("test.block", block)
    register_background("test.count", lambda: counted.append(threading.current_thread()))
    threads = runtime_module.BackgroundThreads(threads=2)  # its own, not the process's
    threads.hand("test.block", (1,))
    threads.hand("test.block", (2,))  # other arguments: a job of its own, holding the other thread
    assert started.acquire(timeout=5) and started.acquire(timeout=5)
    for _ in range(3):
        threads.hand("test.count")  # while both threads are held: one waits, the rest join it
    release.set()
    deadline = time.monotonic() + 5
    while not counted and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(counted) == 1 and counted[0].daemon and counted[0].name.startswith("toolkeeper-background")
    threads.hand("test.count")  # once started, the job may be asked for again
    deadline = time.monotonic() + 5
    while len(counted) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(counted) == 2
    runtime_module.background_run("no.such.job", ())  # an unknown name is logged, not raised
