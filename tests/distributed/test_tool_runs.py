"""Python tools in Celery workers: coroutines and generators run as they do in the local executor, and a
runaway tool (spinning in a thread, or holding the GIL in a process of its own) is stopped at its timeout
so that its worker process serves the next calls, instead of waiting for Celery's hard time limit."""
import time

import pytest

from tests.distributed.stack import process_gone
from tests.distributed.support import statuses

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

COUNTDOWN_S = 8  # a held worker process would keep the second from starting however long the first runs
OVERLAP_WAIT_S = 20.0  # below the hard time limit (timeout + 30 s) that would free a stuck worker process too


def wait_until(condition, message: str, timeout: float = OVERLAP_WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def hardening_session(api, agent: str) -> str:
    session = api.new_session(agent, ops=False)
    call = api.submit(session, "reset_tools", {"ops": True, "hardening": True}, wait=10)
    assert call["status"] == "succeeded", call
    return session


def both_worker_processes_serve(api, session) -> None:
    """Two countdowns run at the same time: each of the two worker processes has taken one. Each lasts long
    enough that a busy machine, slow to hand the second one to its process, still shows them overlap."""
    first = api.submit(session, "countdown", {"seconds": COUNTDOWN_S})
    second = api.submit(session, "countdown", {"seconds": COUNTDOWN_S})
    wait_until(lambda: all(api.call(c["id"])["status"] == "running" for c in (first, second)),
               "the two calls never ran at the same time: a worker process is still held")
    for call in (first, second):
        assert api.wait_terminal(call["id"])["status"] == "succeeded"


def test_coroutines_and_streams_run_in_workers(deployment):
    api = deployment.api(deployment.b)
    session = hardening_session(api, "shapes-bot")
    greeting = api.submit(session, "stack_greeting", {"name": "Ada"}, wait=30)
    assert greeting["status"] == "succeeded", greeting
    assert greeting["result"]["content"][0]["text"] == "hello Ada"
    assert [e["data"]["text"] for e in api.events(greeting["id"]) if e["kind"] == "output"] == ["greeting Ada"]
    squares = api.submit(session, "stack_squares", {"count": 3}, wait=60)
    assert squares["status"] == "succeeded", squares
    assert squares["result"]["structured"] == [1, 4, 9]
    assert [e["data"]["text"] for e in api.events(squares["id"]) if e["kind"] == "output"] == ["1", "4", "9"]


def test_a_spinning_tool_is_stopped_at_its_timeout_and_its_worker_process_serves_again(deployment):
    api = deployment.api(deployment.b)
    session = hardening_session(api, "spin-bot")
    workers = sorted(deployment.stack.worker_children())
    call = api.submit(session, "stack_spin", {}, wait=30)
    assert call["status"] == "timed_out", call
    assert call["error"]["errorType"] == "TimedOut"
    both_worker_processes_serve(api, session)
    assert sorted(deployment.stack.worker_children()) == workers  # no process was killed to free it


def test_a_process_tool_holding_the_gil_is_killed_at_its_timeout(deployment):
    api = deployment.api(deployment.b)
    session = hardening_session(api, "power-bot")
    workers = sorted(deployment.stack.worker_children())
    call = api.submit(session, "stack_power", {"exponent": 10**8}, wait=30)
    assert call["status"] == "timed_out", call
    assert statuses(api.events(call["id"])) == ["queued", "running", "timed_out"]
    # Worker processes start their tool processes as they start, so the tool ran and reported its process.
    [pid] = [int(e["data"]["text"]) for e in api.events(call["id"]) if e["kind"] == "output"]
    wait_until(lambda: process_gone(pid), f"the tool's process {pid} still runs")
    both_worker_processes_serve(api, session)
    assert sorted(deployment.stack.worker_children()) == workers
