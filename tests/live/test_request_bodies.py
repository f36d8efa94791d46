"""Request bodies at the socket of a real daphne server: what is refused is answered before the body is
sent (a declared size over the limit, an API request without credentials), a chunked body is refused
as it grows past the limit and read whole under it, and malformed multipart bodies and stream
parameters get clean answers. Daphne receives a whole body before the application runs, so before,
each of these waited for (and stored) the body, read a chunked one as empty, or answered a bare 400.
"""
import asyncio
import json
import socket

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

ANSWER_TIMEOUT = 15  # bounds a server that waits for a body it should refuse; not a speed measure


def _request(server, head: dict, parts=(), *, key=None, path="/api/v1/sessions") -> tuple[int, dict, bytes]:
    """Send the request line, headers and `parts` of a body, then read the answer (status, headers, body)."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    lines += [f"{name}: {value}" for name, value in head.items()]
    with socket.create_connection(("127.0.0.1", server.port), timeout=ANSWER_TIMEOUT) as sock:
        sock.sendall("\r\n".join(lines).encode() + b"\r\n\r\n")
        for part in parts:
            try:
                sock.sendall(part)
            except BrokenPipeError:
                break  # the server answered early and closed its side: read what it said
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            pytest.fail(f"no answer within {ANSWER_TIMEOUT} s; got {answer[:200]!r}")
        except ConnectionResetError:
            pass  # the server closed a connection whose body it did not read
    head_bytes, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head_bytes.decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in header_lines)}
    return int(status_line.split()[1]), headers, body


def _error(headers: dict, body: bytes) -> dict:
    assert headers["content-type"].startswith("application/json"), (headers, body)
    return json.loads(body)["error"]


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


JSON = {"Content-Type": "application/json"}


def test_an_unauthenticated_huge_body_is_401_before_it_is_sent(toolkeeper_server):
    status, headers, body = _request(toolkeeper_server, {**JSON, "Content-Length": "300000000"})
    assert status == 401 and _error(headers, body)["code"] == "not_authenticated"
    assert headers["www-authenticate"] == "Bearer"


def test_a_malformed_key_with_a_huge_body_is_401_before_it_is_sent(toolkeeper_server):
    status, headers, body = _request(toolkeeper_server, {**JSON, "Content-Length": "300000000"}, key="tk_nope")
    assert status == 401 and _error(headers, body)["code"] == "authentication_failed"


def test_a_huge_declared_body_is_413_before_it_is_sent(toolkeeper_server):
    head = {**JSON, "Content-Length": "300000000", "Expect": "100-continue"}
    status, headers, body = _request(toolkeeper_server, head, key=toolkeeper_server.api_key)
    assert status == 413 and _error(headers, body)["code"] == "too_large"


def test_a_chunked_body_is_413_as_soon_as_it_grows_past_the_limit(toolkeeper_server):
    # 1.5 MiB (the limit is 1 MiB) and no closing chunk: a server that waits for the end never answers.
    parts = [_chunk(b"x" * 65536) for _ in range(24)]
    status, headers, body = _request(toolkeeper_server, {**JSON, "Transfer-Encoding": "chunked"}, parts,
                                     key=toolkeeper_server.api_key)
    assert status == 413 and _error(headers, body)["code"] == "too_large"


def test_a_chunked_body_under_the_limit_is_read_whole(toolkeeper_server):
    payload = json.dumps({"agent": "chunked-bot", "context": {"blob": "y" * 200_000}}).encode()
    parts = [_chunk(payload[:1000]), _chunk(payload[1000:]), b"0\r\n\r\n"]
    status, _, body = _request(toolkeeper_server, {**JSON, "Transfer-Encoding": "chunked"}, parts,
                               key=toolkeeper_server.api_key)
    assert status == 201, body[:300]
    session = json.loads(body)
    assert session["agent"] == "chunked-bot" and len(session["context"]["blob"]) == 200_000


@pytest.mark.parametrize("content_type", ["multipart/form-data", "multipart/form-data; boundary="])
def test_a_multipart_body_without_a_boundary_gets_the_json_envelope(toolkeeper_server, content_type):
    status, headers, body = _request(toolkeeper_server, {"Content-Type": content_type, "Content-Length": "1"},
                                     [b"x"], key=toolkeeper_server.api_key)
    assert 400 <= status < 500 and _error(headers, body)["message"]


def test_a_malformed_call_on_a_stream_refuses_the_handshake_without_an_exception(toolkeeper_server):
    created = _request(toolkeeper_server, {**JSON, "Content-Length": "15"}, [b'{"agent": "ws"}'],
                       key=toolkeeper_server.api_key)
    session = json.loads(created[2])["id"]
    base = toolkeeper_server.url.replace("http://", "ws://")

    async def refused(query: str) -> int:
        try:
            socket_ = await websockets.connect(f"{base}/ws/api/sessions/{session}/?{query}",
                                               subprotocols=[f"bearer.{toolkeeper_server.api_key}"], open_timeout=10)
        except InvalidStatus as exc:
            return exc.response.status_code
        await socket_.close()
        raise AssertionError(f"?{query} was accepted")

    assert asyncio.run(refused("call=zzz")) == 403
    assert asyncio.run(refused("after=soon")) == 403
    log = toolkeeper_server.log_tail(200_000)
    assert "Traceback" not in log and "ValidationError" not in log


def test_an_unknown_page_gets_the_friendly_404_not_the_url_list(toolkeeper_server):
    """The server runs with the embedded default's settings (no DEBUG set): Django's debug page, which lists
    every URL pattern, is for a developer who asks for it with DEBUG=1."""
    response = httpx.get(f"{toolkeeper_server.url}/no-such-page/", timeout=ANSWER_TIMEOUT)
    assert response.status_code == 404
    assert "There is nothing here" in response.text, response.text[:500]
    assert "URLconf" not in response.text and "api/v1/" not in response.text
