"""Two server processes on one database serve one MCP session alternately: nothing of a session lives in a
process, so a request may reach either (no session affinity behind a load balancer)."""
import http.client
import json

import pytest

from tests.live.conftest import _require_postgres
from tests.live.server import LiveServer, temporary_pg_database

pytestmark = pytest.mark.live

PROTOCOL = "2025-11-25"


@pytest.fixture(scope="module")
def servers():
    _require_postgres()
    with temporary_pg_database() as (name, url), LiveServer(database_url=url, database_name=name) as first:
        second = first.sibling()
        try:
            yield first, second
        finally:
            second.stop()


def rpc(server, method: str, params: dict, headers: dict) -> tuple[dict, dict]:
    """One JSON-RPC request to /mcp/: (the response's headers, its result), from JSON or an SSE stream."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
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
                       if line.startswith("data:") and '"id":1' in line.replace(" ", ""))
    message = json.loads(payload)
    assert "result" in message, message
    return answer_headers, message["result"]


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
    calls = json.loads(first.manage("shell", "-c", (
        "import json; from tools.models import ToolCall; print(json.dumps([[c.tool_name, c.status] for c in "
        f"ToolCall.all_tenants.filter(session_id='{opened['mcp-session-id']}').order_by('created_at')]))")
    ).strip().splitlines()[-1])
    assert calls == [["reset_tools", "succeeded"], ["current_time", "succeeded"], ["current_time", "succeeded"]]
