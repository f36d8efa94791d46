"""The ASGI entry refuses bodies before it reads them (tenancy.entry.bodies.BodyGuard and the API-key lane):
these tests drive the real ASGI application and never send a body the server should not read, so an
application that waits for one fails them. Chunked bodies (no Content-Length) are read, within the limit.

Daphne receives a body before the application runs; tests/live/test_request_bodies.py checks the same
refusals at the socket, as the bytes arrive.
"""
import asyncio
import json

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.test import override_settings

from toolkeeper.handlers import EARLY_KEY_CHECK_BYTES, http_application
from tools.models import AgentSession

pytestmark = pytest.mark.django_db(transaction=True)
application = http_application(get_asgi_application())


def scope(path: str, headers: dict) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80),
            "headers": [(b"host", b"127.0.0.1"), *((k.encode(), v.encode()) for k, v in headers.items())]}


async def _exchange(path: str, headers: dict, chunks: list[bytes], *, finish: bool = True) -> tuple[int, bytes]:
    """Send `chunks` (the last one ends the body when `finish`), then read the answer."""
    communicator = ApplicationCommunicator(application, scope(path, headers))
    for index, chunk in enumerate(chunks):
        more = index < len(chunks) - 1 or not finish
        await communicator.send_input({"type": "http.request", "body": chunk, "more_body": more})
    start = await communicator.receive_output(timeout=20)
    assert start["type"] == "http.response.start", start
    body = b""
    while True:
        message = await communicator.receive_output(timeout=20)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.send_input({"type": "http.disconnect"})
    await communicator.wait(timeout=5)
    return start["status"], body


def exchange(path, headers, chunks=(), **kwargs) -> tuple[int, dict]:
    status, body = asyncio.run(_exchange(path, headers, list(chunks), **kwargs))
    return status, json.loads(body)


def bearer(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


JSON = {"content-type": "application/json"}


def test_a_declared_length_over_the_limit_is_413_before_the_body_is_read(world):
    headers = {**JSON, **bearer(world.a.keys["agent"]), "content-length": "300000000"}
    status, body = exchange("/api/v1/sessions", headers)  # no body is ever sent
    assert status == 413 and body["error"]["code"] == "too_large"


@pytest.mark.parametrize("headers, code", [
    ({}, "not_authenticated"),
    ({"authorization": "Basic dXNlcjpwYXNz"}, "authentication_failed"),
    ({"authorization": "Bearer not-a-key"}, "authentication_failed"),
])
def test_an_api_body_without_credentials_is_401_before_it_is_read(world, headers, code):
    status, body = exchange("/api/v1/sessions", {**JSON, **headers, "content-length": "300000000"})
    assert status == 401 and body["error"]["code"] == code


def test_a_large_body_with_an_invalid_key_is_401_before_it_is_read(world):
    real = world.a.keys["agent"]
    forged = real[:-4] + "abcd"
    headers = {**JSON, **bearer(forged), "content-length": str(EARLY_KEY_CHECK_BYTES + 1)}
    status, body = exchange("/api/v1/sessions", headers)
    assert status == 401 and body["error"]["message"] == "Invalid or revoked API key."


def test_a_large_body_with_a_valid_key_is_read_and_served(world):
    payload = json.dumps({"agent": "big", "context": {"blob": "x" * (EARLY_KEY_CHECK_BYTES * 2)}}).encode()
    headers = {**JSON, **bearer(world.a.keys["agent"]), "content-length": str(len(payload))}
    status, body = exchange("/api/v1/sessions", headers, [payload[:1000], payload[1000:]])
    assert status == 201, body
    assert AgentSession.objects.for_tenant(world.a.tenant).get(pk=body["id"]).context["blob"].startswith("xxx")


def test_a_chunked_body_is_read_with_its_length(world):
    payload = json.dumps({"agent": "chunked-bot", "context": {"k": "v"}}).encode()
    headers = {**JSON, **bearer(world.a.keys["agent"]), "transfer-encoding": "chunked"}
    status, body = exchange("/api/v1/sessions", headers, [payload[:7], payload[7:20], payload[20:]])
    assert status == 201, body
    assert (body["agent"], body["context"]) == ("chunked-bot", {"k": "v"})


def test_a_chunked_body_is_413_as_soon_as_it_grows_past_the_limit(world):
    headers = {**JSON, **bearer(world.a.keys["agent"]), "transfer-encoding": "chunked"}
    with override_settings(TOOLKEEPER_MAX_BODY_BYTES=1000):
        # The body never ends: the answer must come once 1,000 bytes have passed.
        status, body = exchange("/api/v1/sessions", headers, [b"x" * 600, b"x" * 600], finish=False)
    assert status == 413 and body["error"]["code"] == "too_large"
    assert not AgentSession.objects.for_tenant(world.a.tenant).filter(agent="chunked-bot").exists()


def test_console_uploads_have_their_own_limit(world):
    boundary = "b0undary"
    upload = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"a.txt\"\r\n"
              f"Content-Type: text/plain\r\n\r\n{'word ' * 400_000}\r\n--{boundary}--\r\n").encode()
    headers = {"content-type": f"multipart/form-data; boundary={boundary}", "content-length": str(len(upload))}
    path = "/t/acme/knowledge/datasets/1/upload/"
    with override_settings(TOOLKEEPER_MAX_UPLOAD_BYTES=len(upload) - 1):
        status, body = asyncio.run(_exchange(path, headers, []))
    assert status == 413 and body.startswith(b"413 ")
    assert len(upload) > 1024 * 1024  # over the API's limit, within the upload limit: read and parsed
    status, body = asyncio.run(_exchange(path, headers, [upload]))
    assert status == 403 and b"CSRF" in body  # the CSRF check read the form (a browser sends its token)
