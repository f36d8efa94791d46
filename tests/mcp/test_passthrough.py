"""What `/mcp/` passes through faithfully (docs/mcp.md): output schemas and structured results, progress with its
numbers and total, the session's instructions at `initialize`, and log messages at the level the client set. A
live server with a real upstream MCP server (tests.mcp.servers over streamable HTTP) registered by its tenant, and
the `mcp` SDK's client on the other side."""
import uuid

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.live.server import LiveServer
from tests.mcp.support import HttpServer
from tests.mcp.test_endpoint import db, new_session, rest

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("mcp-passthrough"),
              pytest.mark.filterwarnings("ignore:The logging capability is deprecated")]  # 2025-era clients use it

UPSTREAM = ["lookup", "slow", "chatty", "bad_shape", "echo"]
LOOKUP_SCHEMA = {"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "string"}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    upstream = HttpServer(tmp_path_factory.mktemp("passthrough") / "upstream.jsonl").start()
    try:
        with LiveServer(extra_env={"TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1",
                                   "TOOLKEEPER_MCP_MAX_WAIT_S": "3"}) as live:
            admin = live.admin_api_key
            status, created = rest(live, "POST", "/api/v1/mcp-servers", {
                "name": "up", "transport": "streamable_http", "url": upstream.url(), "trusted": True}, key=admin)
            assert status == 201, created
            status, synced = rest(live, "POST", f"/api/v1/mcp-servers/{created['id']}/sync", key=admin)
            assert status == 200 and synced["sync"]["status"] == "ok", synced
            status, group = rest(live, "POST", "/api/v1/groups", {
                "name": "upstream", "default_active": True, "tools": [f"mcp__up__{name}" for name in UPSTREAM]},
                key=admin)
            assert status == 201, group
            yield live
            print(f"--- server log (tail) ---\n{live.log_tail(20000)}")
    finally:
        upstream.stop()


def connected(server, work, *, session: str | None = None, agent: str = "", mode: str = "legacy", logs=None,
              log_level=None):
    """Run `work(client)` with the SDK's client on /mcp/ (for `session`, or a new one of `agent`); `logs`, a list,
    collects the log messages it hears."""
    headers = {**server.headers(), **({"X-Toolkeeper-Session": session} if session else {}),
               **({"X-Toolkeeper-Agent": agent} if agent else {})}

    async def main():
        async def heard(params):
            if logs is not None:
                logs.append(params)

        transport = streamable_http_client(f"{server.url}/mcp/",
                                           http_client=httpx2.AsyncClient(headers=headers, timeout=30))
        async with Client(transport, mode=mode, logging_callback=heard, log_level=log_level) as client:
            return await work(client)

    return anyio.run(main)


def test_an_upstream_output_schema_is_listed_and_its_structured_result_reaches_the_client(server):
    session = new_session(server, agent="schema-bot")

    async def working(client):
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        looked_up = await client.call_tool("mcp__up__lookup", {"key": "shade"})
        broken = await client.call_tool("mcp__up__bad_shape", {})
        return listed, looked_up, broken

    listed, looked_up, broken = connected(server, working, session=session)
    assert listed["mcp__up__lookup"].output_schema == LOOKUP_SCHEMA
    assert listed["mcp__up__echo"].output_schema is None  # the server declares none
    # the SDK's client checked the structured content against the schema it was listed with
    assert looked_up.is_error is False
    assert looked_up.structured_content == {"key": "shade", "value": "value"}
    # a result that breaks its server's own schema never reaches the client as a result
    assert broken.is_error is True and broken.structured_content["errorType"] == "UpstreamToolError"

    status, mcp_format = rest(server, "GET", f"/api/v1/sessions/{session}/tools?format=mcp")
    assert status == 200
    by_name = {tool["name"]: tool for tool in mcp_format["tools"]}
    assert by_name["mcp__up__lookup"]["outputSchema"] == LOOKUP_SCHEMA
    assert "outputSchema" not in by_name["mcp__up__echo"]
    status, openai = rest(server, "GET", f"/api/v1/sessions/{session}/tools?format=openai")
    assert status == 200 and "outputSchema" not in str(openai)  # a format without output schemas keeps none
    status, answer = rest(server, "POST", f"/api/v1/sessions/{session}/calls",
                          {"name": "mcp__up__lookup", "input": {"key": "size"}, "wait": 20})
    assert status == 200 and answer["calls"][0]["result"]["structured"] == {"key": "size", "value": "value"}


def test_upstream_progress_reaches_the_client_with_its_numbers_and_total(server):
    session = new_session(server, agent="progress-numbers-bot")
    received = []

    async def progress(value, total, message):
        received.append((value, total, message))

    async def calling(client):
        return await client.call_tool("mcp__up__slow", {"steps": 4, "delay": 0.02}, progress_callback=progress)

    result = connected(server, calling, session=session)
    assert result.is_error is False
    assert received == [(i, 4, f"step {i} of 4") for i in range(1, 5)]
    [call] = db(server, "import json; from tools.models import ToolCall; print(json.dumps([str(c.pk) for c in "
                        f"ToolCall.all_tenants.filter(session_id='{session}')]))")
    status, events = rest(server, "GET", f"/api/v1/calls/{call}/events")
    assert status == 200, events
    progress_events = [event["data"] for event in events["events"] if event["kind"] == "progress"]
    # the REST events keep their share done and gain the numbers
    assert progress_events == [{"text": f"step {i} of 4", "progress": i / 4, "completed": i, "total": 4}
                               for i in range(1, 5)]


def test_initialize_carries_the_sessions_instructions_bounded(server):
    admin = server.admin_api_key
    marker = uuid.uuid4().hex
    for agent, notes in (("instructed-bot", f"Answer in French. {marker}"),
                         ("verbose-bot", "\n".join(f"rule {i}: {'be careful ' * 10}" for i in range(400)))):
        status, group = rest(server, "POST", "/api/v1/groups", {
            "name": f"notes-{agent}", "default_active": True, "switchable": False, "notes": notes,
            "agents": [agent]}, key=admin)
        assert status == 201, group

    async def instructions(client):
        return client.instructions

    text = connected(server, instructions, agent="instructed-bot")
    assert f"Answer in French. {marker}" in text
    session = new_session(server, agent="instructed-bot")
    status, prompt = rest(server, "GET", f"/api/v1/sessions/{session}/prompt")
    assert status == 200 and connected(server, instructions, session=session) == prompt["text"]  # one text, one way

    long = connected(server, instructions, agent="verbose-bot")
    assert len(long) <= 8000 and "rule 0:" in long and long.endswith("/prompt]") and "rule 399" not in long
    assert marker not in long  # another agent's group notes are not this session's
    assert connected(server, instructions, agent="verbose-bot", mode="auto")[:200] == long[:200]  # 2026 era


def test_log_messages_reach_the_client_at_the_level_it_set(server):
    tag = uuid.uuid4().hex[:8]
    logs: list = []

    async def chatting(client):
        assert client.server_capabilities.logging is not None  # announced at the handshake
        await client.set_logging_level("warning")
        await client.call_tool("mcp__up__chatty", {"tag": f"{tag}-a"})
        await client.set_logging_level("info")
        await client.call_tool("mcp__up__chatty", {"tag": f"{tag}-b"})

    connected(server, chatting, agent="log-bot", logs=logs)
    said = [(params.level, " ".join(str(params.data).split()[:3])) for params in logs if tag in str(params.data)]
    assert said == [("warning", f"chatty: {tag}-a warns"), ("info", f"chatty: {tag}-b started"),
                    ("warning", f"chatty: {tag}-b warns")]  # the upstream logger's name leads its message
    assert all(len(str(params.data)) <= 2000 for params in logs)  # 10,000 characters upstream, bounded
    assert {params.logger for params in logs if tag in str(params.data)} == {"mcp__up__chatty"}


def test_without_a_level_no_log_messages_come_and_a_2026_era_request_asks_for_its_own(server):
    tag = uuid.uuid4().hex[:8]
    silent, modern = [], []

    async def chatting(client):
        return await client.call_tool("mcp__up__chatty", {"tag": tag})

    assert connected(server, chatting, agent="quiet-bot", logs=silent).is_error is False
    assert silent == []
    connected(server, chatting, agent="modern-log-bot", mode="auto", logs=modern, log_level="info")
    assert [params.level for params in modern if tag in str(params.data)] == ["info", "warning"]


def test_the_platforms_own_notes_on_a_call_are_log_messages(server):
    status, rule = rest(server, "POST", "/api/v1/rules", {"behavior": "ask", "tool_pattern": "mcp__up__echo",
                                                          "agents": ["noted-bot"]}, key=server.admin_api_key)
    assert status == 201, rule
    logs: list = []

    async def asking(client):
        await client.set_logging_level("notice")
        pending = await client.call_tool("mcp__up__echo", {"x": 1})
        await client.set_logging_level("debug")
        ran = await client.call_tool("mcp__up__lookup", {"key": "k"})  # no rule asks: it runs
        return pending, ran

    try:
        pending, ran = connected(server, asking, agent="noted-bot", logs=logs)
    finally:
        rest(server, "DELETE", f"/api/v1/rules/{rule['id']}", key=server.admin_api_key)
    assert pending.structured_content["status"] == "pending_approval" and ran.is_error is False
    call_id = pending.structured_content["call_id"]
    asked = [(params.level, params.data) for params in logs if params.logger == "mcp__up__echo"]
    assert asked == [("notice", f"call {call_id} is waiting for a reviewer's approval")]  # debug notes: below notice
    notes = [(params.level, params.data) for params in logs if params.logger == "mcp__up__lookup"]
    assert ("debug", "call call_2: running") in notes and ("debug", "call call_2: succeeded") in notes
