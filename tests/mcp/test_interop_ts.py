"""`/mcp/` with an independently written MCP client: the TypeScript SDK's `Client` over its streamable HTTP
transport (tests/mcp/conformance/ts_client.mjs), next to the Python SDK client of test_endpoint.py.

One node run does every connection of the module, one after the other, and prints what the client got; the
tests assert on it. While it runs, this side acts as the reviewer who approves the call that needs approval,
once the client has heard a heartbeat of the waiting call.
"""
import http.client
import json
import subprocess
import threading
import time

import pytest

from tests.live.server import LiveServer
from tests.mcp.conformance.node import HERE, require_node

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("mcp-interop-ts")]  # one server, one node run

SCRIPT = HERE / "ts_client.mjs"
NODE_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def server():
    require_node()
    with LiveServer(extra_env={"TOOLKEEPER_MCP_HEARTBEAT_S": "0.2", "TOOLKEEPER_MCP_MAX_WAIT_S": "30"}) as live:
        yield live
        print(f"--- {live.url} server log (tail) ---\n{live.log_tail(20000)}")


def rest(server, method: str, path: str, body=None, key: str | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={**server.headers(key), "Content-Type": "application/json"})
        response = conn.getresponse()
        payload = response.read()
    finally:
        conn.close()
    return response.status, (json.loads(payload) if payload else {})


def new_session(server, agent: str) -> str:
    status, body = rest(server, "POST", "/api/v1/sessions", {"agent": agent})
    assert status == 201, body
    return body["id"]


def new_rule(server, rules: list, **rule) -> None:
    status, body = rest(server, "POST", "/api/v1/rules", rule, key=server.admin_api_key)
    assert status == 201, body
    rules.append(body["id"])


def calls_of(server, session_ids: dict) -> dict:
    """Per name, the (tool, status) of each call of that session, oldest first: one management shell."""
    code = ("import json; from tools.models import ToolCall; sessions = " + json.dumps(session_ids) + "; "
            "print(json.dumps({name: [[c.tool_name, c.status] for c in ToolCall.all_tenants.filter("
            "session_id=pk).order_by('created_at')] for name, pk in sessions.items()}))")
    return json.loads(server.manage("shell", "-c", code).strip().splitlines()[-1])


class Reviewer:
    """Approves the first pending request of `agent` once the client has heard a heartbeat of its call."""

    def __init__(self, server, agent: str, connection: str):
        self.server, self.agent, self.connection = server, agent, connection
        self.decided: dict | None = None

    def heard(self, event: dict) -> None:
        if self.decided is not None or event.get("connection") != self.connection:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status, inbox = rest(self.server, "GET", f"/api/v1/approvals?agent={self.agent}",
                                 key=self.server.admin_api_key)
            assert status == 200, inbox
            pending = inbox["results"] if isinstance(inbox, dict) else inbox
            if pending:
                status, self.decided = rest(self.server, "POST", f"/api/v1/approvals/{pending[0]['id']}/decide",
                                            {"decision": "approve", "message": "fine"}, key=self.server.admin_api_key)
                assert status == 200, self.decided
                return
            time.sleep(0.05)
        raise AssertionError(f"the client heard progress, but no request of {self.agent} reached the inbox")


def run_client(server, connections: list, reviewer: Reviewer) -> tuple[dict, list]:
    """Run the TS client over the connections; returns its results and the progress events it printed."""
    plan = {"url": f"{server.url}/mcp/", "connections": connections}
    process = subprocess.Popen([require_node(), str(SCRIPT), json.dumps(plan)], cwd=HERE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    watchdog = threading.Timer(NODE_TIMEOUT_S, process.kill)
    watchdog.start()
    events, results, lines = [], None, []
    try:
        for line in process.stdout:
            lines.append(line)
            message = json.loads(line)
            if "results" in message:
                results = message["results"]
            else:
                events.append(message)
                reviewer.heard(message)
        stderr = process.stderr.read()
        process.wait()
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0 and results is not None, \
        f"the TS client exited with {process.returncode}:\n{''.join(lines)[-4000:]}\n{stderr[-4000:]}"
    return results, events


@pytest.fixture(scope="module")
def ts(server):
    """Everything the TS client did and got, and what the server says about it."""
    rules: list = []
    new_rule(server, rules, behavior="deny", tool_pattern="current_time", agents=["ts-deny-bot"],
             note="not for this agent")
    new_rule(server, rules, behavior="ask", tool_pattern="current_time", agents=["ts-approve-bot"])
    sessions = {name: new_session(server, agent) for name, agent in [
        ("surface", "support-bot"), ("denied", "ts-deny-bot"), ("progress", "ts-progress-bot"),
        ("switch", "ts-switch-bot"), ("approval", "ts-approve-bot")]}
    status, ops = rest(server, "POST", f"/api/v1/sessions/{sessions['progress']}/calls",
                       {"name": "reset_tools", "input": {"ops": True}, "wait": 10})
    assert status == 200 and ops["calls"][0]["status"] == "succeeded", ops
    status, surface = rest(server, "GET", f"/api/v1/sessions/{sessions['surface']}/tools?format=mcp")
    assert status == 200, surface

    def attached(name: str) -> dict:
        return {**server.headers(), "X-Toolkeeper-Session": sessions[name]}

    connections = [
        {"name": "surface", "headers": attached("surface"), "ops": [
            {"op": "list"}, {"op": "call", "name": "current_time", "arguments": {}}]},
        {"name": "own", "headers": {**server.headers(), "X-Toolkeeper-Agent": "ts-own-bot"}, "ops": [
            {"op": "list"}, {"op": "call", "name": "current_time", "arguments": {"timezone": "Asia/Tokyo"}},
            {"op": "call", "name": "current_time", "arguments": {"timezone": "Mars/Olympus_Mons"}}]},
        {"name": "denied", "headers": attached("denied"), "ops": [
            {"op": "call", "name": "current_time", "arguments": {}},
            {"op": "call", "name": "no_such_tool", "arguments": {}}]},
        {"name": "progress", "headers": attached("progress"), "ops": [
            {"op": "call", "name": "countdown", "arguments": {"seconds": 2}, "progress": True}]},
        {"name": "switch", "headers": attached("switch"), "ops": [
            {"op": "list"}, {"op": "call", "name": "reset_tools", "arguments": {"ops": True}}, {"op": "list"}]},
        {"name": "approval", "headers": attached("approval"), "ops": [
            {"op": "call", "name": "current_time", "arguments": {"timezone": "UTC"}, "progress": True}]},
    ]
    reviewer = Reviewer(server, "ts-approve-bot", "approval")
    try:
        started = time.monotonic()
        results, events = run_client(server, connections, reviewer)
        print(f"the TS client ran for {time.monotonic() - started:.1f} s")
    finally:
        for rule in rules:
            rest(server, "DELETE", f"/api/v1/rules/{rule}", key=server.admin_api_key)
    for name, outcome in results.items():
        assert "connectError" not in outcome, (name, outcome)
    own = results["own"]["sessionId"]
    status, own_surface = rest(server, "GET", f"/api/v1/sessions/{own}/tools?format=mcp") if own else (0, {})
    return {"results": results, "events": events, "sessions": sessions, "surface": surface["tools"],
            "own_surface": own_surface.get("tools"), "decided": reviewer.decided,
            "calls": calls_of(server, {**sessions, **({"own": own} if own else {})})}


def as_listed(tool: dict) -> dict:
    """A tool of the REST listing as an MCP client lists it: without empty fields."""
    return {key: value for key, value in tool.items() if value not in (None, {})}


def op(ts, connection: str, index: int) -> dict:
    return ts["results"][connection]["ops"][index]


def test_the_client_initializes_and_lists_the_attached_sessions_surface(ts):
    surface = ts["results"]["surface"]
    assert surface["serverVersion"]["name"] == "toolkeeper"
    assert "tools" in surface["capabilities"]
    assert surface["protocolVersion"]  # negotiated
    listed = op(ts, "surface", 0)
    assert "error" not in listed, listed
    assert listed["tools"] == [as_listed(tool) for tool in ts["surface"]]
    clock = next(tool for tool in listed["tools"] if tool["name"] == "current_time")
    assert "timezone" not in clock["inputSchema"].get("properties", {})  # bound for support-bot: hidden


def test_a_connection_of_its_own_gets_a_session_and_lists_its_surface(ts):
    own = ts["results"]["own"]
    assert own["sessionId"] and own["sessionId"] not in ts["sessions"].values()
    listed = op(ts, "own", 0)
    assert listed["tools"] == [as_listed(tool) for tool in ts["own_surface"]]
    assert [tool["name"] for tool in listed["tools"]] == [tool["name"] for tool in ts["surface"]]
    assert ts["calls"]["own"] == [["current_time", "succeeded"], ["current_time", "failed"]]


def test_an_allowed_call_returns_content_and_structured_content(ts):
    result = op(ts, "surface", 1)["result"]
    assert result.get("isError") in (None, False)
    assert result["structuredContent"]["timezone"] == "Europe/Berlin"  # the value bound for support-bot
    assert result["content"][0]["type"] == "text" and "Europe/Berlin" in result["content"][0]["text"]
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    tokyo = op(ts, "own", 1)["result"]
    assert tokyo.get("isError") in (None, False) and tokyo["structuredContent"]["timezone"] == "Asia/Tokyo"
    assert ts["calls"]["surface"] == [["current_time", "succeeded"]]


def test_a_tools_own_error_is_an_error_result(ts):
    failed = op(ts, "own", 2)
    assert "error" not in failed, failed
    result = failed["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["errorType"] == "InvalidTimezone"
    assert result["structuredContent"]["tool"] == "current_time"
    assert "Mars/Olympus_Mons" in result["content"][0]["text"]


def test_a_denied_call_is_an_error_result_and_an_unknown_tool_a_protocol_error(ts):
    denied = op(ts, "denied", 0)
    assert "error" not in denied, denied
    assert denied["result"]["isError"] is True
    assert denied["result"]["structuredContent"]["errorType"] == "PermissionDenied"
    assert denied["result"]["content"][0]["text"]
    unknown = op(ts, "denied", 1)
    assert "result" not in unknown, unknown
    assert unknown["error"]["name"] == "McpError" and unknown["error"]["code"] == -32602
    assert "no_such_tool" in unknown["error"]["message"]
    assert ts["calls"]["denied"] == [["current_time", "denied"]]  # the unknown tool never became a call


def test_a_long_tools_progress_reaches_onprogress_in_order_before_its_result(ts):
    countdown = op(ts, "progress", 0)
    assert "error" not in countdown, countdown
    assert countdown["result"].get("isError") in (None, False)
    assert countdown["result"]["content"][0]["text"] == "counted down 2 seconds"
    values = [heard["progress"] for heard in countdown["progress"]]
    assert values == sorted(set(values))  # strictly increasing, as MCP requires
    tool_messages = [heard["message"] for heard in countdown["progress"] if not heard["message"].startswith("call ")]
    assert tool_messages == ["2 s left", "1 s left", "done"]
    printed = [event for event in ts["events"] if event["connection"] == "progress"]
    assert [event["progress"] for event in printed] == values  # heard as they came, not after the result
    assert ts["calls"]["progress"] == [["reset_tools", "succeeded"], ["countdown", "succeeded"]]


def test_a_call_approved_while_the_client_waits_returns_its_result(ts):
    assert ts["decided"] is not None and ts["decided"]["status"] == "approved"
    approved = op(ts, "approval", 0)
    assert "error" not in approved, approved
    result = approved["result"]
    assert result.get("isError") in (None, False)
    assert result["structuredContent"]["timezone"] == "UTC"
    beats = approved["progress"]
    assert beats and beats[0]["message"].startswith("call ")  # heartbeats while it waited for the reviewer
    assert [beat["progress"] for beat in beats] == sorted({beat["progress"] for beat in beats})
    assert ts["calls"]["approval"] == [["current_time", "succeeded"]]


def test_switching_groups_changes_the_list_and_the_client_hears_so(ts):
    before, switched, after = (op(ts, "switch", index) for index in range(3))
    assert switched["result"].get("isError") in (None, False), switched
    assert "countdown" not in [tool["name"] for tool in before["tools"]]
    assert "countdown" in [tool["name"] for tool in after["tools"]]
    # tools/list_changed on the stream of the switching call; and, when the client's GET notification stream was
    # already open as the switch committed, once more on that stream (docs/mcp.md, "Notifications": both carry
    # it), heard a moment later: during the switch or the next op, never before the switch and never a third time.
    heard = ts["results"]["switch"]["listChanged"]
    assert heard[0] == 1 and len(heard) <= 2 and set(heard) <= {1, 2}, heard
    assert ts["calls"]["switch"] == [["reset_tools", "succeeded"]]
