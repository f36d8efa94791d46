"""`wait` in the distributed mode (PostgreSQL + the Redis channel layer, one daphne process).

A wait that hears nothing for a while must end like any other wait: after its timeout, with the
call as it stands, never with a server error from the channel layer.
"""
import httpx
import pytest

pytestmark = [pytest.mark.live, pytest.mark.postgres]

QUIET_WAIT_S = 8  # longer than the channel layer's blocking receive (5 s)


@pytest.fixture
def client(toolkeeper_server_distributed):
    server = toolkeeper_server_distributed
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=60) as client:
        yield client


def new_session(client: httpx.Client, agent: str) -> str:
    response = client.post("/api/v1/sessions", json={"agent": agent})
    assert response.status_code == 201, response.text
    session = response.json()["id"]
    response = client.post(f"/api/v1/sessions/{session}/calls",
                           json={"name": "reset_tools", "input": {"ops": True}, "wait": 10})
    assert response.json()["calls"][0]["status"] == "succeeded", response.text
    return session


def test_a_call_completes_through_the_redis_layer(client):
    session = new_session(client, "support-bot")
    response = client.post(f"/api/v1/sessions/{session}/calls",
                           json={"name": "countdown", "input": {"seconds": 2}, "wait": 30})
    assert response.status_code == 200, response.text
    call = response.json()["calls"][0]
    assert call["status"] == "succeeded", call
    assert call["result"]["content"][0]["text"] == "counted down 2 seconds"


def test_a_quiet_wait_times_out_cleanly(client):
    busy, quiet = new_session(client, "busy-bot"), new_session(client, "quiet-bot")
    # Fill the demo tenant's parallel cap (8), so the quiet session's call stays queued: no event
    # reaches the quiet session's group while it is waited on.
    filler = [{"id": f"fill_{n}", "name": "countdown", "input": {"seconds": 60}} for n in range(8)]
    response = client.post(f"/api/v1/sessions/{busy}/calls", json={"calls": filler})
    assert response.status_code == 200, response.text
    fillers = [c["id"] for c in response.json()["calls"]]
    try:
        response = client.post(f"/api/v1/sessions/{quiet}/calls",
                               json={"name": "countdown", "input": {"seconds": 1}})
        call = response.json()["calls"][0]
        assert call["status"] == "queued", "precondition: the tenant's cap should hold this call back"

        waited = client.get(f"/api/v1/calls/{call['id']}", params={"wait": QUIET_WAIT_S})
        assert waited.status_code == 200, waited.text
        assert waited.json()["status"] == "queued"

        cancelled = client.post(f"/api/v1/calls/{call['id']}/cancel")
        assert cancelled.json()["status"] == "cancelled", cancelled.text
    finally:
        for call_id in fillers:
            client.post(f"/api/v1/calls/{call_id}/cancel")
