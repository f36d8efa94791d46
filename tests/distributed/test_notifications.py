"""In the distributed mode a notification is sent by a Celery worker after the request's commit, signed, and
logged; a decision through the API is told the same way."""
import hashlib
import hmac
import json
import time

import pytest

from tests.distributed.support import Api
from tests.tools import http_endpoint

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.xdist_group("distributed")]

SECRET = "distributed-signing-secret"


@pytest.fixture
def receiver():
    yield from http_endpoint.serve()


def posted(receiver, count: int, timeout: float = 30) -> list:
    deadline = time.monotonic() + timeout
    while len([r for r in receiver.received if r.method == "POST"]) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    found = [r for r in receiver.received if r.method == "POST"]
    assert len(found) >= count, f"the receiver got {len(found)} of {count} messages"
    return found


def verified(received) -> dict:
    stamp = received.headers["X-Toolkeeper-Timestamp"]
    expected = "v1=" + hmac.new(SECRET.encode(), f"{stamp}.".encode() + received.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(received.headers["X-Toolkeeper-Signature"], expected)
    return json.loads(received.body)


def test_workers_send_signed_notifications_of_new_and_decided_requests(deployment, receiver):
    tenant = deployment.b
    with Api(deployment.url, tenant.admin_key) as admin, Api(deployment.url, tenant.api_key) as app:
        made = admin.http.post("/api/v1/queues", json={"name": "notify-dist"})
        assert made.status_code == 201, made.text
        rule = admin.http.post("/api/v1/rules", json={"behavior": "ask", "tool_pattern": "current_time",
                                                      "agents": ["notify-bot"], "queue": "notify-dist"})
        assert rule.status_code == 201, rule.text
        channel = admin.http.post("/api/v1/notify-channels", json={
            "queue": "notify-dist", "name": "hook", "kind": "webhook", "events": ["requested", "decided"],
            "url": receiver.url + "/echo/dist", "signing_secret": SECRET})
        assert channel.status_code == 201, channel.text
        session = app.new_session("notify-bot", ops=False)
        call = app.submit(session, "current_time", {})
        assert call["status"] == "awaiting_approval", call
        [first] = posted(receiver, 1)
        opened = verified(first)
        assert opened["event"] == "requested" and opened["request"]["call"] == call["id"]
        decided = admin.http.post(f"/api/v1/approvals/{opened['request']['id']}/decide",
                                  json={"decision": "reject", "message": "not now"})
        assert decided.status_code == 200, decided.text
        second = verified(posted(receiver, 2)[1])
        assert (second["event"], second["request"]["status"]) == ("decided", "rejected")
        deadline = time.monotonic() + 10
        while True:
            log = admin.http.get("/api/v1/notify-deliveries", params={"channel": "hook"}).json()["results"]
            if all(d["status"] == "sent" for d in log) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert sorted((d["event"], d["status"], d["attempts"]) for d in log) == [
            ("decided", "sent", 1), ("requested", "sent", 1)]
