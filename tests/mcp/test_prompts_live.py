"""Upstream prompts through a live `/mcp/` (docs/mcp.md#prompts): a real MCP server over streamable HTTP offers
prompts; the tenant syncs it and puts one of its tools in `basic`; a real SDK client lists and gets the prompts,
in both protocol eras; a prompt a deny rule always refuses is neither listed nor gettable; bad arguments are
refused; another tenant never sees them; the get reaches the server with the server's stored credential, never
the caller's key."""
import json

import anyio
import httpx2
import pytest
from mcp import types
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.live.server import LiveServer
from tests.mcp.support import HttpServer

pytestmark = pytest.mark.live

STORED = "Bearer stored-prompt-credential"
SETUP = """
import json
from approvals.services import rule_create
from tenancy.models import Tenant
from tools.catalog.services import group_tools_add
from tools.models import Tool, ToolGroup
from tools.upstream.servers import mcp_server_create, mcp_server_sync

tenant = Tenant.objects.get(slug="demo")
server = mcp_server_create(tenant=tenant, name="local", transport="streamable_http", url={url!r},
                           headers={{"Authorization": {stored!r}}}, timeout_s=20)
result = mcp_server_sync(server=server)
group_tools_add(group=ToolGroup.objects.for_tenant(tenant).get(name="basic"),
                tools=[Tool.objects.for_tenant(tenant).get(name="mcp__local__echo")])
rule_create(tenant=tenant, behavior="deny", tool_pattern="mcp__local__picture")
# a second server whose tools are in the switchable group `ops`: its prompts come with the group
side = mcp_server_create(tenant=tenant, name="side", transport="streamable_http", url={url!r}, timeout_s=20)
mcp_server_sync(server=side)
group_tools_add(group=ToolGroup.objects.for_tenant(tenant).get(name="ops"),
                tools=[Tool.objects.for_tenant(tenant).get(name="mcp__side__echo")])
print(json.dumps(result["prompts"]))
"""


@pytest.fixture(scope="module")
def upstream_server(tmp_path_factory):
    server = HttpServer(tmp_path_factory.mktemp("prompts-http") / "upstream.jsonl").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(upstream_server):
    with LiveServer(extra_env={"TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1"}) as live:
        live.manage("createtenant", "initech")
        live.credentials["b_key"] = json.loads(live.manage("createapikey", "--tenant", "initech", "--json"))["key"]
        synced = live.manage("shell", "-c", SETUP.format(url=upstream_server.url(), stored=STORED))
        live.credentials["synced"] = json.loads(synced.strip().splitlines()[-1])
        yield live


def mcp(server, work, *, mode: str = "auto", key: str | None = None, agent: str = "prompt-bot", heard=None):
    async def main():
        headers = {**server.headers(key), "X-Toolkeeper-Agent": agent}
        http_client = httpx2.AsyncClient(headers=headers, timeout=60)

        async def hear(message):
            if heard is not None:
                heard.append(message)

        transport = streamable_http_client(f"{server.url}/mcp/", http_client=http_client)
        async with Client(transport, mode=mode, message_handler=hear) as client:
            return await work(client)
    return anyio.run(main)


def code_of(server, work, **options) -> tuple[int, str]:
    async def failing(client):
        try:
            await work(client)
        except MCPError as exc:
            return exc.error.code, exc.error.message
        return None, ""
    return mcp(server, failing, **options)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_client_lists_and_gets_an_upstream_servers_prompts(server, upstream_server, mode):
    assert server.credentials["synced"] == {"added": 4, "updated": 0, "removed": 0, "skipped": []}

    async def work(client):
        listed = await client.list_prompts()
        greeting = await client.get_prompt("mcp__local__greet", {"name": "Ada", "mood": mode})
        brief = await client.get_prompt("mcp__local__brief", {"topic": "tides"})
        return client.server_capabilities, listed, greeting, brief

    capabilities, listed, greeting, brief = mcp(server, work, mode=mode)
    assert capabilities.prompts is not None
    names = {prompt.name for prompt in listed.prompts}
    assert {"mcp__local__greet", "mcp__local__brief"} <= names and "mcp__local__picture" not in names
    greet = next(prompt for prompt in listed.prompts if prompt.name == "mcp__local__greet")
    assert [(a.name, a.required) for a in greet.arguments] == [("name", True), ("mood", False)]
    assert greeting.messages[0].role == "user" and greeting.messages[0].content.text == f"Hello Ada, {mode}"
    assert isinstance(brief.messages[0].content, types.EmbeddedResource)
    assert brief.messages[0].content.resource.text == "notes on tides"
    seen = [e for e in upstream_server.log.events("prompt", name="greet") if e["arguments"].get("mood") == mode]
    assert len(seen) == 1 and seen[0]["authorization"] == STORED  # the server's credential, not the caller's key


def test_a_denied_prompt_is_neither_listed_nor_gettable(server, upstream_server):
    code, message = code_of(server, lambda client: client.get_prompt("mcp__local__picture"))
    assert code == types.INVALID_PARAMS and "no prompt named 'mcp__local__picture'" in message
    assert upstream_server.log.events("prompt", name="picture") == []


def test_bad_arguments_are_refused_cleanly(server):
    code, message = code_of(server, lambda client: client.get_prompt("mcp__local__greet", {"mood": "x"}))
    assert code == types.INVALID_PARAMS and "needs the argument 'name'" in message
    code, message = code_of(server, lambda client: client.get_prompt("mcp__local__greet",
                                                                    {"name": "A", "extra": "x"}))
    assert code == types.INVALID_PARAMS and "takes no argument 'extra'" in message
    code, _ = code_of(server, lambda client: client.get_prompt("mcp__nope__nothing"))
    assert code == types.INVALID_PARAMS


def test_another_tenant_never_sees_them(server):
    b_key = server.credentials["b_key"]
    listed = mcp(server, lambda client: client.list_prompts(), key=b_key)
    assert [prompt.name for prompt in listed.prompts] == []
    code, _ = code_of(server, lambda client: client.get_prompt("mcp__local__greet", {"name": "Ada"}), key=b_key)
    assert code == types.INVALID_PARAMS


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_switching_on_a_group_with_a_servers_tools_offers_its_prompts_and_says_so(server, mode):
    heard: list = []

    async def switching(client):
        before = {prompt.name for prompt in (await client.list_prompts()).prompts}
        switched = await client.call_tool("reset_tools", {"ops": True})
        after = {prompt.name for prompt in (await client.list_prompts()).prompts}
        got = await client.get_prompt("mcp__side__greet", {"name": "Grace"})
        return before, switched, after, got

    before, switched, after, got = mcp(server, switching, mode=mode, agent=f"switch-{mode}", heard=heard)
    assert switched.is_error is False
    assert "mcp__local__greet" in before and "mcp__side__greet" not in before
    assert "mcp__side__greet" in after and got.messages[0].content.text == "Hello Grace"
    assert any(type(message).__name__ == "PromptListChangedNotification"
               or getattr(getattr(message, "root", None), "method", "") == "notifications/prompts/list_changed"
               for message in heard), heard


def test_a_prompts_argument_is_completed_by_its_server_under_the_prompts_rules(server, upstream_server):
    greet = types.PromptReference(type="ref/prompt", name="mcp__local__greet")

    async def work(client):
        offered = await client.complete(greet, {"name": "name", "value": "A"})
        none = await client.complete(greet, {"name": "mood", "value": "h"}, {"name": "Ada"})
        return client.server_capabilities, offered, none

    capabilities, offered, none = mcp(server, work)
    assert capabilities.completions is not None
    assert offered.completion.values == ["Ada", "Alan"] and none.completion.values == []
    asked = [e for e in upstream_server.log.events("complete") if e["argument"] == {"name": "name", "value": "A"}]
    assert asked and asked[-1]["ref"]["name"] == "greet" and asked[-1]["authorization"] == STORED

    picture = types.PromptReference(type="ref/prompt", name="mcp__local__picture")  # a deny rule hides it
    code, message = code_of(server, lambda client: client.complete(picture, {"name": "x", "value": ""}))
    assert code == types.INVALID_PARAMS and "no prompt named 'mcp__local__picture'" in message
    code, message = code_of(server, lambda client: client.complete(greet, {"name": "colour", "value": ""}))
    assert code == types.INVALID_PARAMS and "takes no argument 'colour'" in message
    code, message = code_of(server, lambda client: client.complete(greet, {"name": "name", "value": "x" * 20_000}))
    assert code == types.INVALID_PARAMS and "longer than" in message
    template = types.ResourceTemplateReference(type="ref/resource", uri="file:///{path}")
    code, message = code_of(server, lambda client: client.complete(template, {"name": "path", "value": ""}))
    assert code == types.INVALID_PARAMS and "no such resource template" in message
    # another tenant's key never reaches the prompt, even by its name
    code, _ = code_of(server, lambda client: client.complete(greet, {"name": "name", "value": "A"}),
                      key=server.credentials["b_key"])
    assert code == types.INVALID_PARAMS


def test_a_rule_that_hides_a_prompt_is_announced_on_the_notification_stream(server):
    """A deny rule added over the API, with the client's notification stream open: the prompts changed, its tools
    did not; only the prompts' list_changed is heard, and the prompt is gone from the next listing."""
    heard: list[str] = []
    streaming = None

    async def opened(response):
        if response.request.method == "GET" and response.status_code == 200:
            streaming.set()

    async def main():
        nonlocal streaming
        streaming = anyio.Event()
        changed = anyio.Event()

        async def hear(message):
            method = getattr(getattr(message, "root", message), "method", "") or type(message).__name__
            heard.append(method)
            if "prompt" in method.lower():
                changed.set()

        headers = {**server.headers(None), "X-Toolkeeper-Agent": "prompt-watch"}
        http_client = httpx2.AsyncClient(headers=headers, timeout=60, event_hooks={"response": [opened]})
        transport = streamable_http_client(f"{server.url}/mcp/", http_client=http_client)
        async with Client(transport, mode="legacy", message_handler=hear) as client:
            with anyio.fail_after(30):
                await streaming.wait()
            assert "mcp__local__brief" in {p.name for p in (await client.list_prompts()).prompts}
            rule = await anyio.to_thread.run_sync(rest_rule, server, "mcp__local__brief")
            try:
                with anyio.fail_after(30):
                    await changed.wait()
                return {p.name for p in (await client.list_prompts()).prompts}
            finally:
                await anyio.to_thread.run_sync(rest_delete_rule, server, rule)

    listed = anyio.run(main)
    assert "mcp__local__brief" not in listed and "mcp__local__greet" in listed
    assert not any("tools" in method.lower() for method in heard), heard  # its tools were not touched


def rest_rule(server, pattern: str) -> int:
    with httpx2.Client(base_url=server.url, headers=server.headers(server.admin_api_key), timeout=30) as http:
        response = http.post("/api/v1/rules", json={"behavior": "deny", "tool_pattern": pattern,
                                                    "agents": ["prompt-watch"]})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def rest_delete_rule(server, rule: int) -> None:
    with httpx2.Client(base_url=server.url, headers=server.headers(server.admin_api_key), timeout=30) as http:
        assert http.delete(f"/api/v1/rules/{rule}").status_code == 204
