"""The tool search over `/mcp/` with the SDK client (docs/mcp.md, docs/governance.md#tool-search): a session of a
tenant that lists the core and the search finds a tool, switches it on, hears `tools/list_changed`, and calls it;
another session of the same key and agent does not see it."""
import json

import pytest
from mcp.shared.exceptions import MCPError

from tests.live.server import LiveServer
from tests.mcp.test_endpoint import mcp, new_session, rest

pytestmark = pytest.mark.live


def list_changed(heard) -> int:
    return sum(1 for message in heard
               if type(message).__name__ == "ToolListChangedNotification"
               or getattr(getattr(message, "root", message), "method", "") == "notifications/tools/list_changed")


@pytest.fixture(scope="module")
def server():
    with LiveServer() as live:
        live.manage("createtenant", "finders")
        live.credentials["admin_key"] = json.loads(live.manage(
            "createapikey", "--tenant", "finders", "--scopes", "admin", "--json"))["key"]
        live.credentials["agent_key"] = json.loads(live.manage("createapikey", "--tenant", "finders", "--json"))["key"]
        yield live


def test_search_then_enable_changes_the_list_and_says_so(server):
    status, body = rest(server, "PATCH", "/api/v1/governance", {"tool_surface": "search"},
                        key=server.credentials["admin_key"])
    assert status == 200 and body["tool_surface"] == "search", body
    key = server.credentials["agent_key"]
    session, other = new_session(server, "finder-bot", key=key), new_session(server, "finder-bot", key=key)
    heard: list = []
    seen: dict = {}

    async def work(client):
        seen["before"] = [tool.name for tool in (await client.list_tools()).tools]
        searched = await client.call_tool("search_tools", {"query": "evaluate an arithmetic expression"})
        seen["after_search"] = list_changed(heard)
        enabled = await client.call_tool("enable_tools", {"names": [searched.structured_content["tools"][0]["name"]]})
        seen["after"] = [tool.name for tool in (await client.list_tools()).tools]
        ran = await client.call_tool("calculate", {"expression": "(2 + 3) * 4"})
        return searched, enabled, ran

    searched, enabled, ran = mcp(server, work, key=key, headers={"X-Toolkeeper-Session": session}, heard=heard)
    assert {"search_tools", "enable_tools", "current_time"} <= set(seen["before"])
    assert "calculate" not in seen["before"]
    assert searched.is_error is False and searched.structured_content["tools"][0]["name"] == "calculate"
    assert seen["after_search"] == 0  # a search changes nothing
    assert enabled.is_error is False and list_changed(heard) >= 1
    assert "calculate" in seen["after"]
    assert ran.is_error is False and "20" in ran.content[0].text

    async def elsewhere(client):
        listed = [tool.name for tool in (await client.list_tools()).tools]
        try:
            await client.call_tool("calculate", {"expression": "1 + 1"})
        except MCPError as exc:  # the JSON-RPC error of a tool the session cannot see
            return listed, exc
        return listed, None

    listed, refused = mcp(server, elsewhere, key=key, headers={"X-Toolkeeper-Session": other})
    assert "calculate" not in listed and "search_tools" in listed
    assert refused is not None and "no tool named 'calculate'" in str(refused)
