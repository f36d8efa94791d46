"""The lean reader of `/mcp/` (docs/notes/mcp.md, "MCP endpoint — server"): a 2026-era POST carrying one
`tools/call`, `tools/list` or `ping` is answered without the SDK's transport, with the very answer the SDK's
entry gives (status, content type, JSON, ids included); anything else still goes the SDK's way."""
import asyncio
import json
import re

import pytest
from asgiref.sync import sync_to_async

from approvals.services import rule_create
from tests.tools.support import wait_terminal
from tools.calls.submit import calls_submit
from tools.gateway.entry import McpEndpoint
from tools.models import CallStatus, ToolCall

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("drain_calls")]

MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "lean-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}


def post(endpoint: McpEndpoint, message: dict, key: str, session: str, *, leave_when=None,
         **headers) -> tuple[int, dict, bytes]:
    """`leave_when`: a check the client makes every few milliseconds; it disconnects once the check holds."""
    body = json.dumps(message).encode()
    routing = {"mcp-protocol-version": MODERN, "mcp-method": message.get("method", "")}
    if message.get("method") == "tools/call" and isinstance(message.get("params", {}).get("name"), str):
        routing["mcp-name"] = message["params"]["name"]
    routing.update(headers)
    scope = {"type": "http", "method": "POST", "path": "/mcp/", "query_string": b"", "headers": [
        (b"host", b"localhost"), (b"authorization", f"Bearer {key}".encode()),
        (b"content-type", b"application/json"), (b"accept", b"application/json, text/event-stream"),
        (b"x-toolkeeper-session", session.encode()), (b"content-length", str(len(body)).encode()),
        *((name.encode(), value.encode()) for name, value in routing.items())]}
    received = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        if received:
            return received.pop(0)
        if leave_when is None:
            await asyncio.Event().wait()  # the client stays connected
        while not await sync_to_async(leave_when, thread_sensitive=False)():
            await asyncio.sleep(0.02)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def exchange():
        await endpoint(scope, receive, send)
        # A client that left: its call's cancel runs on after the request's task, as on a server whose loop lives
        # on; asyncio.run would cancel it with the loop.
        while leave_when is not None and (rest := asyncio.all_tasks() - {asyncio.current_task()}):
            await asyncio.gather(*rest, return_exceptions=True)

    asyncio.run(exchange())
    if leave_when is not None:
        return 0, {}, b"".join(m.get("body", b"") for m in sent)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, content


def request(number: int, method: str, params: dict | None = None, meta: dict | None = None) -> dict:
    return {"jsonrpc": "2.0", "id": number, "method": method, "params": {**(params or {}), "_meta": meta or META}}


# Each: the message, whether the lean reader answers it. The tenant denies current_time and asks a reviewer for
# todo_write (`test_the_lean_reader_answers_as_the_sdk_does`).
MESSAGES = {
    "allowed": (request(1, "tools/call", {"name": "calculate", "arguments": {"expression": "6*7"}}), True),
    "failed": (request("two", "tools/call", {"name": "calculate", "arguments": {"expression": "1/0"}}), True),
    "denied": (request(3, "tools/call", {"name": "current_time", "arguments": {}}), True),
    # the second run attaches to the call the first left with the reviewer: the same call, the same answer
    "awaiting approval": (request(4, "tools/call", {"name": "todo_write", "arguments": {"todos": []}}), True),
    "unknown tool": (request(5, "tools/call", {"name": "no_such_tool", "arguments": {}}), True),
    "invalid params": (request(6, "tools/call", {"name": "calculate", "arguments": 5}), True),
    "tools/list": (request(7, "tools/list"), True),
    "ping": (request("eight", "ping"), True),  # not a 2026-era method: the SDK's "Method not found"
    "no capabilities": (request(9, "tools/list", meta={"io.modelcontextprotocol/protocolVersion": MODERN}), False),
    "progress wanted": (request(10, "tools/call", {"name": "calculate", "arguments": {"expression": "2"}},
                                meta={**META, "progressToken": "p"}), False),
    "unknown method": (request(11, "prompts/list"), False),
    "malformed": ({"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": {"name": ["x"], "_meta": META}},
                  False),
    "a meta tool": (request(13, "tools/call", {"name": "reset_tools", "arguments": {"math": True}}), False),
}


def normalized(content: bytes, content_type: str | None):
    """The answer with the ids this run generated (call ids, row ids) replaced by placeholders: a JSON answer's
    value, an event stream's text."""
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>", content.decode())
    text = re.sub(r"\bcall_\d+\b", "call_<n>", text)
    return json.loads(text) if content_type == "application/json" else text


def test_the_lean_reader_answers_as_the_sdk_does(world, settings):
    settings.TOOLKEEPER_MCP_MAX_WAIT_S = 1
    a = world.a
    rule_create(tenant=a.tenant, behavior="deny", tool_pattern="current_time")
    rule_create(tenant=a.tenant, behavior="ask", tool_pattern="todo_write")
    key, session = a.keys["agent"], str(a.session.pk)
    answered = {}
    for name, (message, lean) in MESSAGES.items():
        answers = {}
        for on in (True, False):
            settings.TOOLKEEPER_MCP_LEAN = on
            endpoint = McpEndpoint()
            status, headers, content = post(endpoint, message, key, session)
            assert endpoint.lean_answered == (1 if on and lean else 0), name
            assert (endpoint.manager is None) == (on and lean), name  # the SDK's manager never started
            answers[on] = (status, headers.get("content-type"), normalized(content, headers.get("content-type")))
        assert answers[True] == answers[False], name
        status, content_type, body = answers[True]
        if content_type == "application/json":
            assert body["id"] == message["id"], name
        answered[name] = status, body
    assert answered["allowed"][1]["result"]["structuredContent"] == {"expression": "6*7", "value": 42}
    assert answered["failed"][1]["result"]["isError"] is True
    assert answered["denied"][1]["result"]["structuredContent"]["errorType"] == "PermissionDenied"
    assert answered["awaiting approval"][1]["result"]["structuredContent"]["status"] == "pending_approval"
    assert answered["unknown tool"] == (400, {"jsonrpc": "2.0", "id": 5, "error": {
        "code": -32602, "message": "no tool named 'no_such_tool' is available in this session"}})
    assert answered["invalid params"][1]["error"]["code"] == -32602
    assert "calculate" in {tool["name"] for tool in answered["tools/list"][1]["result"]["tools"]}
    assert "notifications/tools/list_changed" in answered["a meta tool"][1]  # an event stream: the SDK's way


def test_a_client_that_closes_the_lean_answer_stops_its_call(world, settings):
    """A 2026-era client's cancel is closing its request: the lean reader cancels the handler, which stops the
    call, as through the SDK's entry."""
    settings.TOOLKEEPER_MCP_LEAN = True
    a = world.a
    [opened] = calls_submit(session=a.session, calls=[{"name": "reset_tools", "input": {"ops": True}}])
    assert opened.status == CallStatus.SUCCEEDED
    endpoint = McpEndpoint()
    message = request(1, "tools/call", {"name": "countdown", "arguments": {"seconds": 30}})
    countdowns = ToolCall.objects.for_tenant(a.tenant).filter(session=a.session, tool_name="countdown")

    def running() -> bool:  # the client leaves once its call runs, however slow the machine
        return countdowns.filter(status=CallStatus.RUNNING).exists()

    _, _, sent = post(endpoint, message, a.keys["agent"], str(a.session.pk), leave_when=running)
    assert endpoint.lean_answered == 1 and endpoint.manager is None
    assert sent == b""  # nothing answered to a client that left
    call = countdowns.get()
    assert wait_terminal(call.pk, tenant=a.tenant).status == CallStatus.INTERRUPTED
