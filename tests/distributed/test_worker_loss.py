"""`kill -9` of the worker while a call runs. The call's lease runs out (15 s), the reaper (a beat
job, run by a worker) settles it: an idempotent tool is re-queued and runs again (attempts == 2) and
succeeds once; a non-idempotent tool fails with WorkerLost and never runs a second time."""
import os
import signal

import pytest

from tests.distributed.support import progress, statuses

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

SETTLE_TIMEOUT_S = 90  # lease (15 s) + reaper period (5 s) + a re-run, with room for a loaded machine


def _attempts(deployment, call_id: str) -> int:
    (attempts,), = deployment.stack.sql("SELECT attempts FROM tools_toolcall WHERE id = %s::uuid", [call_id])
    return attempts


def test_killing_the_pool_process_during_an_idempotent_call_retries_it_once(deployment):
    stack = deployment.stack
    api = deployment.api(deployment.a)
    session = api.new_session("reaper-bot")
    call = api.submit(session, "countdown", {"seconds": 6})
    api.wait_events(call["id"], lambda events: len(progress(events)) >= 1)
    assert api.call(call["id"])["status"] == "running"

    children = stack.worker_children()
    assert children, "the worker has no pool processes"
    for pid in children:  # kill -9 the pool processes; the worker's main process forks new ones
        os.kill(pid, signal.SIGKILL)

    final = api.wait_terminal(call["id"], timeout=SETTLE_TIMEOUT_S)
    events = api.events(call["id"])
    assert final["status"] == "succeeded", final
    assert final["result"]["content"][0]["text"] == "counted down 6 seconds"
    assert _attempts(deployment, call["id"]) == 2
    assert statuses(events) == ["queued", "running", "queued", "running", "succeeded"]
    retry = [e for e in events if e["kind"] == "status" and e["data"]["status"] == "queued"][1]
    assert retry["data"].get("retry") == 2
    # The second run counted down from the start and finished: exactly one "done".
    assert [e["data"]["text"] for e in progress(events)].count("done") == 1
    assert set(stack.worker_children()).isdisjoint(children)


def test_killing_the_worker_during_a_non_idempotent_call_fails_it_with_worker_lost(deployment):
    stack = deployment.stack
    api = deployment.api(deployment.a)
    session = api.new_session("reaper-bot-2")
    call = api.submit(session, "slow_write", {"text": "exactly once", "seconds": 6})
    api.wait_events(call["id"], lambda events: len(progress(events)) >= 1)
    assert api.call(call["id"])["status"] == "running"

    stack.kill_worker(signal.SIGKILL)  # the whole worker: main process and pool, kill -9
    stack.start_worker()

    final = api.wait_terminal(call["id"], timeout=SETTLE_TIMEOUT_S)
    assert final["status"] == "failed", final
    assert final["error"]["errorType"] == "WorkerLost", final
    assert final["error"]["callId"] == final["call_id"] and final["error"]["tool"] == "slow_write"
    assert final["result"]["state"] == "error"
    assert _attempts(deployment, call["id"]) == 1

    # The worker is back and runs new calls; the lost call stays failed and its write never happened.
    follow_up = api.submit(session, "slow_write", {"text": "afterwards", "seconds": 1}, wait=30)
    assert follow_up["status"] == "succeeded", follow_up
    events = api.events(call["id"])
    assert statuses(events) == ["queued", "running", "failed"]
    assert not any(e["data"].get("text") == "written" for e in progress(events))
    (state,), = stack.sql("SELECT state FROM tools_agentsession WHERE id = %s::uuid", [session])
    assert state.get("notes") == ["afterwards"], state
