"""`POST /api/v1/mcp-servers/{id}/sync` and `/test` against real servers: a stdio MCP server (the mcp SDK, started
from the allow-list by the MCP client) and an HTTP address where nothing listens. Needs the MCP client
(tools.upstream.client: endpoint_of, mcp_list_tools, mcp_probe)."""
import json
import logging
import socket
import sys
import textwrap

import pytest

from audit.models import Event
from tools.catalog.registry import periodic_jobs
from tools.models import McpServer, Tool
from tools.upstream import source as mcp_source
from tools.upstream.servers import UNEXPECTED, mcp_server_create, mcp_tool_name

pytestmark = pytest.mark.django_db

URL = "/api/v1/mcp-servers"
TOKEN = "Bearer sync-5ecret-Header-0b3e"  # noqa: S105
ENV_SECRET = "sync-5ecret-Env-61aa"  # noqa: S105
UPSTREAM = textwrap.dedent('''
    """A real MCP server on stdio: the tools named in UPSTREAM_TOOLS (a JSON list), each searching nothing."""
    import json
    import os

    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    app = MCPServer("upstream")


    def search(query: str, repo: str = "") -> str:
        """Search code."""
        return f"{query} in {repo}"


    for name in json.loads(os.environ.get("UPSTREAM_TOOLS", '["search"]')):
        hints = ToolAnnotations(readOnlyHint=True, idempotentHint=True) if name.startswith("read") else None
        app.add_tool(search, name=name, description=f"{name}: search code.", annotations=hints)

    app.run()
''')
LISTED = ["search", "repo.search", "read_file", "x" * 90]


@pytest.fixture
def stdio_upstream(tmp_path, settings):
    script = tmp_path / "upstream.py"
    script.write_text(UPSTREAM)
    settings.TOOLKEEPER_MCP_STDIO_SERVERS = {"upstream": {
        "command": sys.executable, "args": [str(script)], "env": {}, "tenant_env": ["UPSTREAM_TOOLS", "API_TOKEN"]}}
    return script


@pytest.fixture
def unreachable_url(settings) -> str:
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/mcp"  # nothing listens there once the socket is closed


def stdio_server(client, listed=LISTED, **fields) -> dict:
    response = client.post(URL, {"name": "files", "transport": "stdio", "command": "upstream", "trusted": True,
                                 "env": {"UPSTREAM_TOOLS": json.dumps(listed), "API_TOKEN": ENV_SECRET},
                                 **fields}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_a_sync_lists_a_real_servers_tools_into_the_catalog(world, stdio_upstream, caplog):
    caplog.set_level(logging.DEBUG)
    client = world.a.client("admin")
    server = stdio_server(client)
    response = client.post(f"{URL}/{server['id']}/sync")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["sync"] == {"status": "ok", "error": "", "added": 4, "updated": 0, "disabled": 0, "held": 0,
                            "skipped": [], "prompts": {"added": 0, "updated": 0, "removed": 0, "skipped": []}}
    assert body["server"]["status"] == "ok" and body["server"]["last_synced_at"] is not None
    names = {t["upstream_name"]: t["name"] for t in body["server"]["tools"]}
    assert names == {upstream: mcp_tool_name("files", upstream) for upstream in LISTED}
    assert names["search"] == "mcp__files__search"
    tools = {t.source_ref: t for t in Tool.objects.for_tenant(world.a.tenant).filter(mcp_server_id=server["id"])}
    assert tools["search"].input_schema["required"] == ["query"]
    assert tools["search"].description == "search: search code."
    assert (tools["read_file"].read_only, tools["read_file"].idempotent) == (True, True)  # trusted: its hints
    assert (tools["search"].read_only, tools["search"].destructive) == (False, True)
    event = Event.objects.for_tenant(world.a.tenant).get(verb="mcp_server.synced")
    assert event.data["added"] == 4 and event.actor_label == "apikey:admin"
    assert client.post(f"{URL}/{server['id']}/test").json()["ok"] is True
    for text in (response.content.decode(), caplog.text, repr(list(Event.objects.for_tenant(world.a.tenant)
                                                                   .values_list("data", flat=True)))):
        assert ENV_SECRET not in text


def test_a_tool_gone_upstream_is_disabled_and_enabled_when_it_returns(world, stdio_upstream):
    client = world.a.client("admin")
    server = stdio_server(client, listed=["search", "repo.search"])
    assert client.post(f"{URL}/{server['id']}/sync").json()["sync"]["added"] == 2
    client.patch(f"{URL}/{server['id']}", {"env": {"UPSTREAM_TOOLS": '["search"]'}}, format="json")
    gone = client.post(f"{URL}/{server['id']}/sync").json()
    assert gone["sync"]["disabled"] == 1
    assert {t["upstream_name"]: (t["enabled"], t["offered"]) for t in gone["server"]["tools"]} == {
        "search": (True, True), "repo.search": (False, False)}
    tools = Tool.objects.for_tenant(world.a.tenant)
    detached = tools.get(name=mcp_tool_name("files", "repo.search"))
    refused = client.patch(f"/api/v1/tools/{detached.pk}", {"enabled": True}, format="json")
    assert refused.status_code == 400 and "no longer offers" in refused.content.decode()
    assert not tools.get(pk=detached.pk).enabled
    offered = tools.get(name=mcp_tool_name("files", "search"))  # an offered one may be switched off and on
    assert client.patch(f"/api/v1/tools/{offered.pk}", {"enabled": False}, format="json").status_code == 200
    assert client.patch(f"/api/v1/tools/{offered.pk}", {"enabled": True}, format="json").status_code == 200
    client.patch(f"{URL}/{server['id']}", {"env": {"UPSTREAM_TOOLS": '["search", "repo.search"]'}}, format="json")
    back = client.post(f"{URL}/{server['id']}/sync").json()
    assert back["sync"]["updated"] == 1
    assert all(t["enabled"] and t["offered"] for t in back["server"]["tools"])


def test_an_unreachable_server_is_recorded_and_its_tools_kept(world, stdio_upstream, unreachable_url, caplog):
    caplog.set_level(logging.DEBUG)
    client = world.a.client("admin")
    created = client.post(URL, {"name": "down", "transport": "streamable_http", "url": unreachable_url,
                                "headers": {"Authorization": TOKEN}, "timeout_s": 5}, format="json")
    assert created.status_code == 201, created.content
    server = McpServer.objects.for_tenant(world.a.tenant).get(pk=created.json()["id"])
    existing = Tool.objects.create(tenant=world.a.tenant, name="mcp__down__search", source="mcp",
                                   source_ref="search", mcp_server=server, input_schema={"type": "object"})
    response = client.post(f"{URL}/{server.pk}/sync")
    assert response.status_code == 200, response.content
    sync = response.json()["sync"]
    assert sync["status"] == "error" and sync["error"] not in ("", UNEXPECTED)
    assert "\n" not in sync["error"] and "Traceback" not in sync["error"] and len(sync["error"]) <= 500
    assert response.json()["server"]["last_error"] == sync["error"]
    server.refresh_from_db()
    assert (server.status, server.last_error, server.last_synced_at) == ("error", sync["error"], None)
    existing.refresh_from_db()
    assert existing.enabled and existing.mcp_server_id == server.pk  # untouched
    tested = client.post(f"{URL}/{server.pk}/test")
    assert tested.status_code == 400 and "the connection test failed" in tested.json()["error"]["message"]
    for text in (response.content.decode(), tested.content.decode(), caplog.text):
        assert "sync-5ecret-Header" not in text


def test_a_url_refused_at_connect_time_is_an_error_in_plain_words(world, unreachable_url, settings):
    """The admin's allow-list closed after the server was saved: the client's guard refuses at connect time."""
    server = mcp_server_create(tenant=world.a.tenant, name="closed", transport="streamable_http", url=unreachable_url)
    settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = []
    sync = world.a.client("admin").post(f"{URL}/{server.pk}/sync").json()["sync"]
    assert sync["status"] == "error" and "loopback" in sync["error"]


def test_the_periodic_sync_takes_every_enabled_server(world, stdio_upstream, monkeypatch):
    """Through the job the tools app registers with the runtime (tools.upstream.source.mcp_sync_register)."""
    monkeypatch.setattr(mcp_source, "_last_attempts", {})
    stdio_server(world.a.client("admin"), listed=["search"])
    off = stdio_server(world.b.client("admin"), listed=["search"], enabled=False)
    job, _every_s = periodic_jobs()["tools.mcp_sync"]
    assert job() == {"synced": 1, "failed": 0, "skipped": 0}
    assert McpServer.objects.for_tenant(world.a.tenant).get().status == "ok"
    assert McpServer.objects.for_tenant(world.b.tenant).get(pk=off["id"]).status == "new"
    assert not Tool.objects.for_tenant(world.b.tenant).filter(source="mcp").exists()
