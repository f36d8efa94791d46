"""The broker stops while apps submit calls. In this setup one Redis is both the Celery broker and the
channel layer, as in a small production install. The API still accepts calls, as `queued`; once Redis
is back, the periodic dispatcher (a beat job) sends them to the workers and they complete: nothing is
lost. Waiting requests (`wait`) must not turn a Redis outage into a 500 either, during or after it.
"""
import time

import pytest

from tests.distributed.support import statuses

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

CALLS = 3
RECOVERY_TIMEOUT_S = 30


@pytest.fixture
def outage(deployment):
    """Stops Redis when called; at teardown Redis is up again and worker, beat and daphne are fresh
    processes, so a stale connection left by the outage cannot leak into other tests."""
    stack = deployment.stack
    yield stack.redis.stop
    if stack.redis.process is None:
        stack.redis.start()
    stack.restart_all()


def test_calls_submitted_while_the_broker_is_down_are_queued_and_complete_after_it_returns(deployment, outage):
    stack = deployment.stack
    api = deployment.api(deployment.a)
    session = api.new_session("outage-bot")

    outage()
    try:
        responses = [api.submit_raw(session, "countdown", {"seconds": 1}) for _ in range(CALLS)]
        # The API answers while the broker is down: no 500, the calls are accepted as queued.
        assert [r.status_code for r in responses] == [200] * CALLS, [r.text for r in responses]
        calls = [r.json()["calls"][0] for r in responses]
        assert [c["status"] for c in calls] == ["queued"] * CALLS, calls
        for call in calls:
            assert api.call(call["id"])["status"] == "queued"
            assert statuses(api.events(call["id"])) == ["queued"]
    finally:
        stack.redis.start()  # the same port: worker, beat and daphne reconnect by themselves

    returned = time.monotonic()
    for call in calls:
        remaining = max(1.0, RECOVERY_TIMEOUT_S - (time.monotonic() - returned))
        final = api.wait_terminal(call["id"], timeout=remaining)
        assert final["status"] == "succeeded", final
        assert statuses(api.events(call["id"])) == ["queued", "running", "succeeded"]
        assert final["result"]["content"][0]["text"] == "counted down 1 seconds"


def test_a_waiting_submit_while_redis_is_down_answers_with_the_queued_call(deployment, outage):
    """With `wait`, the request listens on the channel layer, which is down too. The call is stored
    before the wait starts, so the answer must be 200 with the call as it stands (queued), never a 500
    that makes the app believe nothing happened; and the call must still run once Redis is back."""
    stack = deployment.stack
    api = deployment.api(deployment.a)
    session = api.new_session("outage-bot-2")

    outage()
    try:
        response = api.submit_raw(session, "countdown", {"seconds": 1}, wait=3)
        plain_read = api.http.get(f"/api/v1/sessions/{session}").status_code  # the API itself still answers
    finally:
        stack.redis.start()
    assert plain_read == 200
    assert response.status_code == 200, response.text
    call = response.json()["calls"][0]
    assert call["status"] == "queued", call
    assert api.wait_terminal(call["id"], timeout=RECOVERY_TIMEOUT_S)["status"] == "succeeded"


def test_waiting_requests_work_as_soon_as_redis_is_back(deployment, outage):
    """After a Redis restart, daphne's channel-layer pool holds connections to the old server; the
    first waiting requests must reconnect, not fail with 500 (Connection closed by server / Timeout
    reading from …)."""
    stack = deployment.stack
    api = deployment.api(deployment.a)
    session = api.new_session("outage-bot-3")
    warm = api.submit(session, "countdown", {"seconds": 1}, wait=20)  # daphne's pool holds connections
    assert warm["status"] == "succeeded", warm

    outage()
    stack.redis.start()

    answers = [api.submit_raw(session, "countdown", {"seconds": 1}, wait=20) for _ in range(3)]
    assert [r.status_code for r in answers] == [200] * 3, [r.text[:200] for r in answers]
    assert [r.json()["calls"][0]["status"] for r in answers] == ["succeeded"] * 3
