"""`/mcp/` serves the tools an app declared for its session: `tools/list` shows them as the REST list does, and
a call of one waits for the app, which posts the result with its own key."""
import anyio
import pytest

from tests.live.server import LiveServer
from tests.mcp.test_endpoint import db, mcp, rest

pytestmark = pytest.mark.live

ORDER_TOOL = {"name": "lookup_order", "description": "Look an order up in the shop's back office.",
              "input_schema": {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}}


@pytest.fixture(scope="module")
def server():
    with LiveServer(extra_env={"TOOLKEEPER_MCP_HEARTBEAT_S": "0.2"}) as live:
        yield live


def declaring_session(server, mode: str) -> str:
    status, body = rest(server, "POST", "/api/v1/sessions",
                        {"agent": "declaring-bot", "tools": [ORDER_TOOL], "tools_mode": mode})
    assert status == 201, body
    return body["id"]


def awaiting_call(server, session: str) -> str | None:
    found = db(server, "import json; from tools.models import ToolCall; print(json.dumps([str(c.pk) for c in "
                       f"ToolCall.all_tenants.filter(session_id='{session}', status='awaiting_external')]))")
    return found[0] if found else None


def test_tools_list_shows_declared_tools_and_their_calls_come_back_to_the_app(server):
    added = declaring_session(server, "add")
    status, rest_tools = rest(server, "GET", f"/api/v1/sessions/{added}/tools?format=mcp")
    assert status == 200

    async def listing(client):
        return [tool.model_dump(by_alias=True, exclude_none=True) for tool in (await client.list_tools()).tools]

    listed = mcp(server, listing, headers={"X-Toolkeeper-Session": added})
    assert [tool["name"] for tool in listed] == [tool["name"] for tool in rest_tools["tools"]]
    assert "current_time" in [tool["name"] for tool in listed]
    [order] = [tool for tool in listed if tool["name"] == "lookup_order"]
    assert order["description"] == ORDER_TOOL["description"]
    assert order["inputSchema"]["required"] == ["order"]

    replaced = declaring_session(server, "replace")
    assert [tool["name"] for tool in mcp(server, listing, headers={"X-Toolkeeper-Session": replaced})] == [
        "lookup_order"]

    async def calling(client):
        outcome = {}

        async def call():
            outcome["result"] = await client.call_tool("lookup_order", {"order": "42"})

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            call_id = None
            while call_id is None:  # bounded by the MCP call's own wait
                call_id = await anyio.to_thread.run_sync(awaiting_call, server, replaced)
            status, body = await anyio.to_thread.run_sync(
                lambda: rest(server, "POST", f"/api/v1/calls/{call_id}/result",
                             {"state": "success", "content": [{"type": "text", "text": "order 42: shipped"}],
                              "structured": {"status": "shipped"}}))
            assert status == 200, body
        return outcome["result"]

    result = mcp(server, calling, headers={"X-Toolkeeper-Session": replaced})
    assert result.is_error is False
    assert result.content[0].text == "order 42: shipped"
    assert result.structured_content == {"status": "shipped"}
