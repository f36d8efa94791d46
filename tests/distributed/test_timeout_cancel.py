"""Per-tool timeouts and cancellation work in Celery workers as in the local executor: the worker's
watchdog settles the call and wakes the tool, whose events stop."""
import time

import pytest

from tests.distributed.support import progress, statuses

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

QUIET_S = 2.5  # countdown emits every second: a tool still running would emit twice in this time


def test_a_tool_timeout_ends_the_call_as_timed_out(deployment):
    tenant = deployment.b
    admin = deployment.api(tenant, tenant.admin_key)
    api = deployment.api(tenant)
    tool_id = admin.tool_id("countdown")
    response = admin.http.patch(f"/api/v1/tools/{tool_id}", json={"timeout_s": 2})
    assert response.status_code == 200, response.text
    try:
        session = api.new_session("timeout-bot")
        call = api.submit(session, "countdown", {"seconds": 20}, wait=30)
    finally:
        restored = admin.http.patch(f"/api/v1/tools/{tool_id}", json={"timeout_s": 120})
        assert restored.status_code == 200, restored.text

    assert call["status"] == "timed_out", call
    assert call["error"]["errorType"] == "TimedOut", call
    assert call["error"]["callId"] == call["call_id"] and call["error"]["tool"] == "countdown"
    time.sleep(QUIET_S)
    events = api.events(call["id"])
    assert statuses(events) == ["queued", "running", "timed_out"]
    assert events[-1]["kind"] == "status", "the tool kept emitting after its timeout"
    assert progress(events), events
    assert all(e["data"]["progress"] < 1.0 for e in progress(events)), "the countdown ran to its end"


def test_cancelling_a_running_call_interrupts_it_and_its_events_stop(deployment):
    api = deployment.api(deployment.a)
    session = api.new_session("cancel-bot")
    call = api.submit(session, "countdown", {"seconds": 30})
    api.wait_events(call["id"], lambda events: len(progress(events)) >= 2)

    response = api.cancel(call["id"])
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "interrupted"
    assert response.json()["result"]["state"] == "interrupted"

    time.sleep(QUIET_S)
    events = api.events(call["id"])
    assert statuses(events) == ["queued", "running", "interrupted"]
    assert events[-1]["kind"] == "status" and events[-1]["data"]["status"] == "interrupted", (
        "the tool kept emitting after it was cancelled")
    assert api.call(call["id"])["status"] == "interrupted"
    assert api.cancel(call["id"]).status_code == 409

    # The worker process is free again: a new call runs to its end.
    after = api.submit(session, "countdown", {"seconds": 1}, wait=30)
    assert after["status"] == "succeeded", after
