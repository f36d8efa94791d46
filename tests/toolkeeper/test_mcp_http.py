"""`/mcp/`'s HTTP side in process: a cancel is told apart from other messages, a body read before the SDK
reaches it whole, and a request that cannot be resolved for want of a database gets an answer, not a trace."""
import asyncio
import json

import pytest

from tools.gateway.entry import McpEndpoint, RpcRefusal, _message_of, _whole_body, cancelled_request_id


def notification(params, **extra) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params, **extra}).encode()


@pytest.mark.parametrize(("body", "expected"), [
    (notification({"requestId": 7}), 7),
    (notification({"requestId": "abc", "reason": "timed out"}), "abc"),
    (notification({"requestId": True}), None),  # not a JSON-RPC id
    (notification({"requestId": [1]}), None),
    (notification({"requestId": 7}, id=3), None),  # a request, not a notification
    (notification("7"), None),
    (b'{"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "notifications/cancelled"}}', None),
    (b"notifications/cancelled {", None),
    (b"[" + notification({"requestId": 7}) + b"]", None),
])
def test_only_a_cancel_notification_names_a_request(body, expected):
    assert cancelled_request_id(_message_of(body)) == expected


@pytest.mark.parametrize(("body", "code"), [
    (b"notifications/cancelled {", -32700),
    (b"", -32700),
    (b"\xff\xfe{}", -32700),  # not UTF-8
    (b'{"jsonrpc": "2.0", "id": "\xed\xaf\xbf\xed\xbf\xbf", "method": "ping"}', -32700),  # encoded surrogates
    (b"[" * 100_000 + b"]" * 100_000, -32602),  # too deep for the parser: a value no entry takes
])
def test_a_body_that_cannot_be_read_is_refused_as_json_rpc_refuses_it(body, code):
    refusal = _message_of(body)
    assert isinstance(refusal, RpcRefusal)
    assert (refusal.status, refusal.code) == (400, code)


def test_a_body_read_ahead_is_handed_on_whole_then_the_connection_as_it_is():
    messages = [{"type": "http.request", "body": b'{"a":', "more_body": True},
                {"type": "http.request", "body": b" 1}", "more_body": False},
                {"type": "http.disconnect"}]

    async def receive():
        return messages.pop(0)

    async def main():
        body, replay = await _whole_body(receive)
        return body, await replay(), await replay()

    body, first, then = asyncio.run(main())
    assert body == b'{"a": 1}'
    assert first == {"type": "http.request", "body": b'{"a": 1}', "more_body": False}
    assert then == {"type": "http.disconnect"}


def test_without_a_database_the_answer_is_503_in_the_error_envelope():
    """No `db` fixture: the test database is blocked, so resolving the key fails as an outage would."""
    sent = []
    scope = {"type": "http", "method": "POST", "path": "/mcp/", "query_string": b"",
             "headers": [(b"host", b"localhost"), (b"authorization", b"Bearer tk_demo_abcdefabcdef"),
                         (b"x-toolkeeper-agent", b"a"), (b"content-type", b"application/json")]}

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(McpEndpoint()(scope, receive, send))
    assert sent[0]["status"] == 503
    body = json.loads(b"".join(message.get("body", b"") for message in sent[1:]))
    assert body["error"]["code"] == "unavailable"
    assert "Traceback" not in json.dumps(body)
