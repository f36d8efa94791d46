"""Two server processes on one database and one Redis (the distributed mode's shared parts) serve one MCP
session alternately: nothing of a session lives in a process, so a request may reach either (no session
affinity behind a load balancer)."""
import http.client
import json
import threading

import pytest

from tests.live.conftest import _missing, _require_postgres, live_redis_url
from tests.live.server import LiveServer, temporary_pg_database

pytestmark = pytest.mark.live

PROTOCOL = "2025-11-25"


@pytest.fixture(scope="module")
def servers():
    _require_postgres()
    redis_url = live_redis_url()
    if not redis_url:
        _missing("Redis (127.0.0.1:6379)")
    with temporary_pg_database(migrated_for="toolkeeper.settings") as (name, url), LiveServer(
            database_url=url, database_name=name, redis_url=redis_url, migrated=True,
            extra_env={"TOOLKEEPER_MCP_MAX_WAIT_S": "30"}) as first:
        second = first.sibling()
        try:
            yield first, second
        finally:
            second.stop()


def rpc(server, method: str, params: dict, headers: dict, request_id: int = 1) -> tuple[dict, dict]:
    """One JSON-RPC request to /mcp/: (the response's headers, its result), from JSON or an SSE stream."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=40)
    try:
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        conn.request("POST", "/mcp/", body=body, headers={
            **server.headers(), "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            **headers})
        response = conn.getresponse()
        payload = response.read().decode()
        answer_headers = {name.lower(): value for name, value in response.getheaders()}
    finally:
        conn.close()
    assert response.status == 200, payload
    if answer_headers.get("content-type", "").startswith("text/event-stream"):
        payload = next(line[5:].strip() for line in payload.splitlines()
                       if line.startswith("data:") and f'"id":{request_id}' in line.replace(" ", ""))
    message = json.loads(payload)
    assert "result" in message, message
    return answer_headers, message["result"]


def calls_of(server, session_id: str) -> list[list]:
    return json.loads(server.manage("shell", "-c", (
        "import json; from tools.models import ToolCall; print(json.dumps([[c.tool_name, c.status] for c in "
        f"ToolCall.all_tenants.filter(session_id='{session_id}').order_by('created_at')]))")
    ).strip().splitlines()[-1])


def open_session(server, agent: str) -> dict:
    opened, _ = rpc(server, "initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                           "clientInfo": {"name": "alternating", "version": "1"}},
                    {"X-Toolkeeper-Agent": agent})
    return {"Mcp-Session-Id": opened["mcp-session-id"], "Mcp-Protocol-Version": PROTOCOL}


def test_one_session_served_by_either_process(servers):
    first, second = servers
    opened, _ = rpc(first, "initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                          "clientInfo": {"name": "alternating", "version": "1"}},
                    {"X-Toolkeeper-Agent": "twin-bot"})
    session = {"Mcp-Session-Id": opened["mcp-session-id"], "Mcp-Protocol-Version": PROTOCOL}

    def names(server) -> list[str]:
        return [tool["name"] for tool in rpc(server, "tools/list", {}, session)[1]["tools"]]

    before = names(second)
    assert "current_time" in before and "countdown" not in before
    _, switched = rpc(first, "tools/call", {"name": "reset_tools", "arguments": {"ops": True}}, session)
    assert switched.get("isError") is not True, switched
    after = names(second)  # the other process sees the session's groups as the first left them
    assert "countdown" in after
    _, timed = rpc(second, "tools/call", {"name": "current_time", "arguments": {"timezone": "UTC"}}, session)
    assert timed.get("isError") is not True and timed["structuredContent"]["timezone"] == "UTC"
    _, again = rpc(first, "tools/call", {"name": "current_time", "arguments": {}}, session)
    assert again.get("isError") is not True
    assert calls_of(first, opened["mcp-session-id"]) == [
        ["reset_tools", "succeeded"], ["current_time", "succeeded"], ["current_time", "succeeded"]]


def test_a_cancel_reaching_the_other_process_ends_the_call_and_its_wait(servers):
    first, second = servers
    rule = {"behavior": "ask", "tool_pattern": "current_time", "agents": ["twin-ask"]}
    conn = http.client.HTTPConnection("127.0.0.1", first.port, timeout=30)
    conn.request("POST", "/api/v1/rules", body=json.dumps(rule),
                 headers={**first.headers(first.admin_api_key), "Content-Type": "application/json"})
    assert conn.getresponse().status == 201
    conn.close()
    session = open_session(first, "twin-ask")
    answered: dict = {}
    waiting = threading.Thread(target=lambda: answered.update(result=rpc(
        first, "tools/call", {"name": "current_time", "arguments": {}}, session, request_id=5)[1]))
    waiting.start()
    try:
        for _ in range(100):
            if calls_of(second, session["Mcp-Session-Id"]) == [["current_time", "awaiting_approval"]]:
                break
        cancel = json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}})
        conn = http.client.HTTPConnection("127.0.0.1", second.port, timeout=30)
        conn.request("POST", "/mcp/", body=cancel, headers={
            **second.headers(), "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", **session})
        assert conn.getresponse().status == 202
        conn.close()
    finally:
        waiting.join(timeout=40)
    assert answered["result"]["isError"] is True
    assert answered["result"]["structuredContent"]["status"] == "cancelled"  # heard by the first process
    assert calls_of(second, session["Mcp-Session-Id"]) == [["current_time", "cancelled"]]
