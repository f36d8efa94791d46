"""Requests with an API key take the lean ASGI path (toolkeeper.handlers): same answers, fewer layers.

The rest of the API suite goes through Django's test client and the full middleware stack; these
tests drive the real ASGI application, so what apps meet in production is checked here.
"""
import asyncio
import json
import threading
import time

import pytest
from channels.testing import HttpCommunicator
from django.core.asgi import get_asgi_application
from django.db import close_old_connections, connection
from django.db.backends.signals import connection_created

from toolkeeper.handlers import Lanes, carries_api_key, http_application
from tools.models import CallStatus, ToolCall

pytestmark = pytest.mark.django_db(transaction=True)
application = http_application(get_asgi_application())


async def _call_app(method, path, *, key=None, body=None, host="127.0.0.1", cookie=None):
    headers = [(b"host", host.encode())]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    if cookie is not None:
        headers.append((b"cookie", cookie.encode()))
    raw = json.dumps(body).encode() if body is not None else b""
    if raw:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    response = await HttpCommunicator(application, method, path, body=raw, headers=headers).get_response(timeout=20)
    response["headers"] = {name.decode().lower(): value.decode() for name, value in response["headers"]}
    return response


def call_app(method, path, **kwargs):
    return asyncio.run(_call_app(method, path, **kwargs))


def as_json(response) -> dict:
    return json.loads(response["body"])


def test_answers_match_the_full_stack_and_carry_the_security_headers(world):
    key, session = world.a.keys["agent"], world.a.session
    lean = call_app("GET", f"/api/v1/sessions/{session.pk}", key=key)
    full = world.a.client().get(f"/api/v1/sessions/{session.pk}")
    assert lean["status"] == 200
    assert as_json(lean) == full.json()
    for header in ("x-content-type-options", "x-frame-options", "referrer-policy", "cross-origin-opener-policy"):
        assert lean["headers"][header] == full.headers[header]


def test_errors_keep_the_json_envelope(world):
    key = world.a.keys["agent"]
    bad_host = call_app("GET", "/api/v1/tools", key=key, host="evil.example")
    assert bad_host["status"] == 400 and as_json(bad_host)["error"]["code"] == "bad_request"
    missing = call_app("GET", "/api/v1/no-such-endpoint", key=key)
    assert missing["status"] == 404 and as_json(missing)["error"]["code"] == "not_found"
    revoked = call_app("GET", "/api/v1/tools", key=key[:-3] + "xyz")
    assert revoked["status"] == 401 and "error" in as_json(revoked)
    foreign = call_app("GET", f"/api/v1/sessions/{world.b.session.pk}", key=key)
    assert foreign["status"] == 404


def test_a_waiting_call_returns_settled(world):
    response = call_app("POST", f"/api/v1/sessions/{world.a.session.pk}/calls", key=world.a.keys["agent"],
                              body={"name": "current_time", "input": {}, "wait": 10})
    assert response["status"] == 200
    (call,) = as_json(response)["calls"]
    assert call["status"] == "succeeded" and call["result"]["content"]


def test_a_lane_keeps_its_database_connection_between_requests(world):
    created = []

    def count(sender, connection, **kwargs):
        created.append(threading.current_thread().name)

    connection_created.connect(count)
    try:
        for _ in range(6):
            response = call_app("GET", f"/api/v1/sessions/{world.a.session.pk}", key=world.a.keys["agent"])
            assert response["status"] == 200
    finally:
        connection_created.disconnect(count)
    # Sequential requests reuse one idle lane; its connection was opened at most once.
    assert len([name for name in created if name.startswith("toolkeeper-lane")]) <= 1


def test_lanes_are_reused_and_overflow_gets_its_own_thread():
    lanes = Lanes(1)
    first, pooled = lanes.acquire()
    assert pooled
    overflow, overflow_pooled = lanes.acquire()
    assert not overflow_pooled and overflow is not first
    lanes.release(overflow, overflow_pooled)
    lanes.release(first, pooled)
    again, pooled_again = lanes.acquire()
    assert again is first and pooled_again
    lanes.release(again, pooled_again)


def test_only_lane_threads_keep_connections_past_a_request():
    def connection_survives_request_end() -> bool:
        connection.ensure_connection()
        before = connection.connection
        close_old_connections()  # what Django does when a request finishes
        survived = connection.connection is before
        connection.close()
        return survived

    lanes = Lanes(1)
    lane, pooled = lanes.acquire()
    assert lane.submit(connection_survives_request_end).result()
    lanes.release(lane, pooled)
    request_thread, pooled = Lanes(0).acquire()
    assert not pooled
    assert not request_thread.submit(connection_survives_request_end).result()
    request_thread.shutdown()


def test_only_requests_with_an_authorization_header_take_the_lean_path():
    def scope(path, *headers):
        return {"path": path, "headers": list(headers)}

    assert carries_api_key(scope("/api/v1/tools", (b"authorization", b"Bearer tk_x")))
    assert not carries_api_key(scope("/api/v1/tools", (b"cookie", b"sessionid=abc")))
    assert not carries_api_key(scope("/console/", (b"authorization", b"Bearer tk_x")))


def test_a_wait_notices_a_call_settled_by_another_process(world):
    call = world.a.calls[0]
    ToolCall.objects.for_tenant(world.a.tenant).filter(pk=call.pk).update(status=CallStatus.RUNNING)
    # Another process settles it: a plain UPDATE, so nothing in this process hears of it.
    timer = threading.Timer(0.3, lambda: ToolCall.objects.for_tenant(world.a.tenant).filter(pk=call.pk).update(
        status=CallStatus.SUCCEEDED))
    timer.start()
    started = time.monotonic()
    response = call_app("GET", f"/api/v1/calls/{call.pk}?wait=20", key=world.a.keys["agent"])
    timer.join()
    assert response["status"] == 200 and as_json(response)["status"] == "succeeded"
    assert time.monotonic() - started < 10  # found by the periodic re-read, long before the wait's end
