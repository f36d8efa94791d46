"""`/mcp/`'s streams across server processes (docs/mcp.md, "Streams" and "Notifications"), in the distributed
mode: two server processes on one PostgreSQL database and one Redis.

- A client's notification stream hears `notifications/tools/list_changed` when an operator's edit, made through
  the other process, changes what its session sees; a session the edit does not change, and a session of
  another tenant, hear nothing of it.
- A tools/call stream that drops in the middle is resumed with `Last-Event-ID`: the client receives the progress
  it missed and the result, and the call ran once. An event id resumes nothing for another session or key, and
  a value that is no event id of ours is refused.
"""
import base64
import json

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.live.conftest import _missing, _require_postgres, live_redis_url
from tests.live.server import LiveServer, temporary_pg_database

pytestmark = pytest.mark.live

PROTOCOL = "2025-11-25"
LIST_CHANGED = "notifications/tools/list_changed"


@pytest.fixture(scope="module")
def servers():
    _require_postgres()
    redis_url = live_redis_url()
    if not redis_url:
        _missing("Redis (127.0.0.1:6379)")
    with temporary_pg_database(migrated_for="toolkeeper.settings") as (name, url), LiveServer(
            database_url=url, database_name=name, redis_url=redis_url, migrated=True,
            extra_env={"TOOLKEEPER_MCP_MAX_WAIT_S": "30", "TOOLKEEPER_MCP_HEARTBEAT_S": "30"}) as first:
        first.manage("createtenant", "initech")
        for name_, scopes in (("b_key", "agent"), ("b_admin", "admin")):
            first.credentials[name_] = json.loads(first.manage(
                "createapikey", "--tenant", "initech", "--scopes", scopes, "--json"))["key"]
        second = first.sibling()
        try:
            yield first, second
        finally:
            second.stop()


def rest(server, method: str, path: str, body=None, key: str | None = None) -> dict:
    with httpx2.Client(base_url=server.url, headers=server.headers(key), timeout=30) as http:
        response = http.request(method, path, json=body)
    assert response.status_code < 300, response.text
    return response.json() if response.content else {}


def new_session(server, agent: str, key: str | None = None, groups: dict | None = None) -> str:
    session = rest(server, "POST", "/api/v1/sessions", {"agent": agent}, key=key)["id"]
    if groups:
        answer = rest(server, "POST", f"/api/v1/sessions/{session}/calls",
                      {"name": "reset_tools", "input": groups, "wait": 10}, key=key)
        assert answer["calls"][0]["status"] == "succeeded", answer
    return session


def group_add_tool(server, admin_key: str, group: str, tool: str) -> None:
    """As an operator, through `server`'s API: add `tool` to `group`."""
    groups = rest(server, "GET", "/api/v1/groups?page_size=200", key=admin_key)
    found = next(g for g in (groups["results"] if isinstance(groups, dict) else groups) if g["name"] == group)
    rest(server, "PATCH", f"/api/v1/groups/{found['id']}", {"tools": [*found["tools"], tool]}, key=admin_key)


def calls_of(server, session_id: str) -> list[list]:
    return json.loads(server.manage("shell", "-c", (
        "import json; from tools.models import ToolCall; print(json.dumps([[c.tool_name, c.status] for c in "
        f"ToolCall.all_tenants.filter(session_id='{session_id}').order_by('created_at')]))")
    ).strip().splitlines()[-1])


class Listener:
    """An SDK client of the 2025 era on one session: the tools/list_changed notifications it heard, and whether
    its notification stream (the GET the client opens after `initialize`) is open."""

    def __init__(self, server, session: str, key: str | None = None):
        self.server, self.session, self.key = server, session, key
        self.changes = 0
        self.heard = anyio.Event()
        self.streaming = anyio.Event()
        self.client: Client | None = None

    async def _response(self, response) -> None:
        if response.request.method == "GET" and response.status_code == 200:
            self.streaming.set()  # the server answers once it listens for changes

    async def _message(self, message) -> None:
        if getattr(getattr(message, "root", message), "method", "") == LIST_CHANGED \
                or type(message).__name__ == "ToolListChangedNotification":
            self.changes += 1
            self.heard.set()

    async def names(self) -> list[str]:
        return sorted(tool.name for tool in (await self.client.list_tools()).tools)

    async def next_change(self) -> None:
        with anyio.fail_after(30):
            await self.heard.wait()
        self.heard = anyio.Event()

    def connect(self):
        http_client = httpx2.AsyncClient(headers={**self.server.headers(self.key),
                                                  "X-Toolkeeper-Session": self.session},
                                         timeout=30, event_hooks={"response": [self._response]})
        transport = streamable_http_client(f"{self.server.url}/mcp/", http_client=http_client)
        return Client(transport, mode="legacy", message_handler=self._message)


def test_an_edit_in_another_process_reaches_the_sessions_it_changes_and_no_other(servers):
    first, second = servers
    b_key, b_admin = first.credentials["b_key"], first.credentials["b_admin"]
    a = Listener(first, new_session(first, "watch-ops", groups={"ops": True}))
    c = Listener(first, new_session(first, "watch-plain"))
    b = Listener(first, new_session(first, "watch-other", key=b_key), key=b_key)
    seen: dict = {}

    async def main():
        async with a.connect() as a.client, c.connect() as c.client, b.connect() as b.client:
            with anyio.fail_after(30):
                for listener in (a, b, c):
                    await listener.streaming.wait()
            seen["a before"], seen["c before"] = await a.names(), await c.names()
            # the operator adds `calculate` to `ops`, in the other server process: only `a` has ops switched on
            await anyio.to_thread.run_sync(group_add_tool, second, first.admin_api_key, "ops", "calculate")
            await a.next_change()
            seen["a after"] = await a.names()
            seen["heard with a"] = (c.changes, b.changes)
            # tenant B's own edit reaches its client
            await anyio.to_thread.run_sync(group_add_tool, second, b_admin, "basic", "countdown")
            await b.next_change()
            # `calculate` into basic: new for `c`; `a` saw it already, through ops
            await anyio.to_thread.run_sync(group_add_tool, second, first.admin_api_key, "basic", "calculate")
            await c.next_change()
            seen["c after"] = await c.names()
            seen["changes"] = (a.changes, b.changes, c.changes)

    anyio.run(main)
    assert "calculate" not in seen["a before"] and "calculate" in seen["a after"]
    assert "calculate" not in seen["c before"] and "calculate" in seen["c after"]
    assert seen["heard with a"] == (0, 0)  # the ops edit changed neither c's surface nor tenant B's
    assert seen["changes"] == (1, 1, 1)


def tool_id(server, admin_key: str, name: str) -> str:
    tools = rest(server, "GET", "/api/v1/tools?page_size=500", key=admin_key)
    return next(t["id"] for t in (tools["results"] if isinstance(tools, dict) else tools) if t["name"] == name)


def test_rules_tools_and_the_sessions_own_changes_are_announced_too(servers):
    first, second = servers
    admin = first.admin_api_key
    session = new_session(first, "watch-rules")
    a = Listener(first, session)
    seen: list[tuple[str, bool]] = []

    async def step(what: str, edit, *args) -> None:
        await anyio.to_thread.run_sync(edit, *args)
        await a.next_change()
        seen.append((what, "current_time" in await a.names()))

    async def main():
        async with a.connect() as a.client:
            with anyio.fail_after(30):
                await a.streaming.wait()
            assert "current_time" in await a.names()
            rule = {}

            def deny():  # a deny rule that always refuses the tool hides it (docs/governance.md)
                rule.update(rest(second, "POST", "/api/v1/rules", {
                    "behavior": "deny", "tool_pattern": "current_time", "agents": ["watch-rules"]}, key=admin))

            await step("deny added", deny)
            await step("deny removed", rest, second, "DELETE", f"/api/v1/rules/{rule['id']}", None, admin)
            clock = tool_id(first, admin, "current_time")
            await step("tool disabled", rest, second, "PATCH", f"/api/v1/tools/{clock}", {"enabled": False}, admin)
            await step("tool enabled", rest, second, "PATCH", f"/api/v1/tools/{clock}", {"enabled": True}, admin)
            # the session's own change, made by its app over REST in the other process
            await step("groups switched", rest, second, "POST", f"/api/v1/sessions/{session}/calls",
                       {"name": "reset_tools", "input": {"ops": True}, "wait": 10})
            seen.append(("countdown listed", "countdown" in await a.names()))

    anyio.run(main)
    assert seen == [("deny added", False), ("deny removed", True), ("tool disabled", False),
                    ("tool enabled", True), ("groups switched", True), ("countdown listed", True)]
    assert a.changes == 5


WITHHELD = """
import json
from tenancy.models import Tenant
from tools.models import McpServer, Tool, ToolGroup
tenant = Tenant.objects.get(slug="demo")
server = McpServer.objects.create(tenant=tenant, name="shifty", transport="streamable_http",
                                  url="https://mcp.example/mcp", trusted=True)
tool = Tool.objects.create(tenant=tenant, name="mcp__shifty__lookup", description="Looks up a word.",
                           input_schema={"type": "object"}, source="mcp", source_ref="lookup", mcp_server=server,
                           proposed={"name": "lookup", "description": "Looks up a word, better.",
                                     "input_schema": {"type": "object"}, "output_schema": None, "annotations": {}},
                           proposed_hash="b" * 64)
ToolGroup.objects.get(tenant=tenant, name="basic").tools.add(tool)
print(json.dumps(server.pk))
"""


def test_a_definition_accepted_in_another_process_is_announced_with_its_new_text(servers):
    first, second = servers
    server_id = json.loads(first.manage("shell", "-c", WITHHELD).strip().splitlines()[-1])
    a = Listener(first, new_session(first, "watch-review"))
    seen: dict = {}

    async def main():
        async with a.connect() as a.client:
            with anyio.fail_after(30):
                await a.streaming.wait()
            seen["before"] = await a.names()
            await anyio.to_thread.run_sync(rest, second, "POST", f"/api/v1/mcp-servers/{server_id}/accept",
                                           {"tool": "mcp__shifty__lookup", "hash": "b" * 64}, first.admin_api_key)
            await a.next_change()
            listed = (await a.client.list_tools()).tools
            seen["after"] = {tool.name: tool.description for tool in listed}

    anyio.run(main)
    assert "mcp__shifty__lookup" not in seen["before"]  # withheld while its new definition waited
    assert seen["after"]["mcp__shifty__lookup"] == "Looks up a word, better."


def test_a_2026_era_client_listens_for_changes(servers):
    first, second = servers
    session = new_session(first, "watch-modern")
    seen: dict = {}

    async def main():
        http_client = httpx2.AsyncClient(headers={**first.headers(), "X-Toolkeeper-Session": session}, timeout=30)
        transport = streamable_http_client(f"{first.url}/mcp/", http_client=http_client)
        async with Client(transport, mode="auto") as client:
            seen["before"] = sorted(t.name for t in (await client.list_tools()).tools)
            async with client.listen(tools_list_changed=True) as subscription:
                seen["honored"] = subscription.honored.tools_list_changed
                await anyio.to_thread.run_sync(rest, second, "POST", f"/api/v1/sessions/{session}/calls",
                                               {"name": "reset_tools", "input": {"ops": True}, "wait": 10})
                with anyio.fail_after(30):
                    seen["event"] = type(await subscription.__anext__()).__name__
            seen["after"] = sorted(t.name for t in (await client.list_tools()).tools)

    anyio.run(main)
    assert seen["honored"] is True and seen["event"] == "ToolsListChanged"
    assert "countdown" not in seen["before"] and "countdown" in seen["after"]


# --- resumable call streams ------------------------------------------------------------------------------------

def sse_events(lines):
    """(id, data) of each SSE event of an iterator of lines."""
    event_id, data = None, []
    for line in lines:
        if line == "":
            if event_id is not None or data:
                yield event_id, "\n".join(data)
            event_id, data = None, []
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


def headers_of(server, session: str, key: str | None = None) -> dict:
    return {**server.headers(key), "X-Toolkeeper-Session": session, "Mcp-Protocol-Version": PROTOCOL,
            "Accept": "application/json, text/event-stream"}


def test_a_dropped_call_stream_resumes_with_what_it_missed_and_the_call_runs_once(servers):
    first, second = servers
    session = new_session(first, "resume-bot", groups={"ops": True})
    headers = headers_of(first, session)
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "countdown", "arguments": {"seconds": 3}, "_meta": {"progressToken": "p7"}}}
    before: list[tuple[str, dict]] = []
    with httpx2.Client(timeout=30) as http:
        with http.stream("POST", f"{first.url}/mcp/", json=call, headers=headers) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            for event_id, data in sse_events(response.iter_lines()):
                before.append((event_id, json.loads(data) if data else {}))
                if len(before) == 2:  # the priming event and the first progress: then the connection drops
                    break
        assert before[0][1] == {} and before[0][0]  # a priming event, with an id and no data
        last = before[-1][0]
        assert before[-1][1]["method"] == "notifications/progress"

        # resumed through the other server process
        after: list[dict] = []
        resume = {**headers_of(second, session), "Last-Event-ID": last, "Accept": "text/event-stream"}
        with http.stream("GET", f"{second.url}/mcp/", headers=resume) as response:
            assert response.status_code == 200, response.read()
            for _, data in sse_events(response.iter_lines()):
                if data:
                    after.append(json.loads(data))
                if after and after[-1].get("id") == 7:
                    break

        progress = [m["params"] for _, m in before[1:]] + [m["params"] for m in after if "method" in m]
        messages = [p.get("message") for p in progress]
        assert messages == ["3 s left", "2 s left", "1 s left", "done"]  # each once, in order
        values = [p["progress"] for p in progress]
        assert values == sorted(set(values)) and {p["progressToken"] for p in progress} == {"p7"}
        result = after[-1]["result"]
        assert result.get("isError") is not True and "counted down 3 seconds" in result["content"][0]["text"]
        assert calls_of(first, session) == [["reset_tools", "succeeded"], ["countdown", "succeeded"]]

        # the same id resumes nothing for another session of the key, nor for another tenant's key
        other = new_session(first, "resume-bot")
        for foreign in (headers_of(first, other), headers_of(first, new_session(first, "resume-bot",
                                                                               key=first.credentials["b_key"]),
                                                            key=first.credentials["b_key"])):
            answer = http.get(f"{first.url}/mcp/", headers={**foreign, "Last-Event-ID": last,
                                                             "Accept": "text/event-stream"})
            assert answer.status_code == 404 and "Last-Event-ID" in answer.json()["error"]["message"]

        # an altered id resumes nothing; what is no event id of ours is refused
        prefix, body, mac = last.split(".")
        payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        payload[4] = 0  # from the start
        forged = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode().rstrip("=")
        for value, status in ((f"{prefix}.{forged}.{mac}", 404), ("tk1.AAAA.zz", 400), ("x" * 5000, 400),
                              ("1; DROP TABLE", 400)):
            answer = http.get(f"{first.url}/mcp/", headers={**headers, "Last-Event-ID": value,
                                                             "Accept": "text/event-stream"})
            assert answer.status_code == status, (value, answer.text)
            assert answer.headers["content-type"].startswith(("application/json", "text/plain"))
