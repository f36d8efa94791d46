"""The console's MCP server pages: declared form and button tests (tests/view_cases.py), credentials that no
page ever shows, and each tool's schema as the model sees it."""
import socket

import pytest
from django.test import override_settings
from django.urls import reverse

from audit.models import Event
from tests.console.conftest import console_routes, console_url, page_text
from tests.view_cases import ActionCases, CreateCases, DeleteCases, EditCases
from tools.catalog.services import binding_set, tool_update
from tools.models import McpServer, Tool, ToolGroup
from tools.upstream.client import UpstreamTool
from tools.upstream.servers import UNEXPECTED, mcp_server_create, mcp_tools_reconcile

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://93.184.215.14/mcp"
SECRET = "page-5ecret-Value-81f0"  # noqa: S105
ENV_SECRET = "env-5ecret-Value-2c7d"  # noqa: S105
STDIO = {"files": {"command": "/usr/bin/env", "args": ["mcp-files"], "tenant_env": ["API_TOKEN"]}}


def _server(tw, name="github", **fields) -> McpServer:
    return mcp_server_create(tenant=tw.tenant, name=name, transport="streamable_http", url=PUBLIC_URL,
                             headers={"Authorization": f"Bearer {SECRET}"}, **fields)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once it is closed


class TestMcpServerCreate(CreateCases):
    url_name = "console:mcp_server_create"
    model = McpServer
    audit_verb = "mcp_server.created"
    success_url = "console:mcp_server_detail"
    success_params = (("server_id", "pk"),)

    def valid(self, world):
        return ({"name": "docs", "transport": "streamable_http", "url": PUBLIC_URL, "timeout_s": "45",
                 "headers": f"Authorization: Bearer {SECRET}\nX-Team: core", "include": "search\nfetch\n",
                 "enabled": "on"},
                {"name": "docs", "transport": "streamable_http", "url": PUBLIC_URL, "timeout_s": 45.0,
                 "include": ["search", "fetch"], "enabled": True, "trusted": False,
                 "headers": {"Authorization": f"Bearer {SECRET}", "X-Team": "core"}})

    def invalid(self, world):
        base = {"name": "docs", "transport": "streamable_http", "timeout_s": "30", "enabled": "on"}
        return [
            ({**base, "url": "http://127.0.0.1:8000/mcp"}, "is a loopback address"),
            ({**base, "url": "http://localhost/mcp"}, "is a loopback address"),
            ({**base, "url": "http://169.254.169.254/latest/meta-data/"}, "is a cloud metadata address"),
            ({**base, "url": "http://10.0.0.8/mcp"}, "is a private address"),
            ({**base, "url": ""}, "an HTTP server needs its URL"),
            ({**base, "url": PUBLIC_URL, "name": "Bad_Name"}, "lowercase letters"),
            ({**base, "transport": "stdio"}, "not an allowed stdio server"),
            ({**base, "transport": "stdio", "command": "/bin/sh"}, "Select a valid choice"),
            ({**base, "url": PUBLIC_URL, "headers": f"Authorization Bearer {SECRET}"}, "write Name: value"),
            ({**base, "url": PUBLIC_URL, "headers": "Host: internal"}, "set by the connection"),
            ({**base, "url": PUBLIC_URL, "timeout_s": "0"}, "greater than or equal to 0.1"),
        ]


class TestMcpServerEdit(EditCases):
    url_name = "console:mcp_server_edit"
    param = "server_id"
    model = McpServer
    audit_verb = "mcp_server.updated"
    success_url = "console:mcp_server_detail"
    success_params = (("server_id", "pk"),)

    def target(self, tw):
        return _server(tw)

    def valid(self, world):
        return ({"transport": "streamable_http", "url": PUBLIC_URL + "/v2", "timeout_s": "12", "trusted": "on",
                 "exclude": "delete_repo"},
                {"url": PUBLIC_URL + "/v2", "timeout_s": 12.0, "trusted": True, "enabled": False,
                 "exclude": ["delete_repo"], "headers": {"Authorization": f"Bearer {SECRET}"}})  # headers kept

    def invalid(self, world):
        base = {"transport": "streamable_http", "timeout_s": "30", "enabled": "on"}
        return [
            ({**base, "url": "https://93.184.215.99/mcp"}, "send the headers again"),
            ({**base, "url": "http://[::1]/mcp"}, "is a loopback address"),
            ({**base, "url": PUBLIC_URL, "timeout_s": "5000"}, "less than or equal to 3600"),
            ({**base, "url": PUBLIC_URL, "headers": "{not json"}, "not a valid JSON object of headers"),
        ]


class TestMcpServerDelete(DeleteCases):
    url_name = "console:mcp_server_delete"
    param = "server_id"
    model = McpServer
    audit_verb = "mcp_server.deleted"
    success_url = "console:mcp_server_list"

    def target(self, tw):
        return _server(tw)


class LiveActionCases(ActionCases):
    """Buttons that reach the server: here one on 127.0.0.1 (opened for the test) where nothing listens."""

    param = "server_id"
    model = McpServer
    success_url = "console:mcp_server_detail"
    success_params = (("server_id", "pk"),)

    @pytest.fixture(autouse=True)
    def _loopback_allowed(self, settings):
        settings.TOOLKEEPER_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]

    def target(self, tw):
        return mcp_server_create(tenant=tw.tenant, name="down", transport="streamable_http",
                                 url=f"http://127.0.0.1:{_closed_port()}/mcp", timeout_s=5)


class TestMcpServerSync(LiveActionCases):
    url_name = "console:mcp_server_sync"
    audit_verb = "mcp_server.synced"

    def done(self, tw, obj) -> bool:
        server = McpServer.objects.for_tenant(tw.tenant).get(pk=obj.pk)
        # recorded, in words, as the client reports an unreachable server (not as an unexpected failure)
        return server.status == "error" and server.last_error not in ("", UNEXPECTED)


class TestMcpServerTest(LiveActionCases):
    url_name = "console:mcp_server_test"
    audit_verb = "mcp_server.tested"

    def done(self, tw, obj) -> bool:
        event = Event.objects.for_tenant(tw.tenant).filter(verb="mcp_server.tested").get()
        return event.data["ok"] is False and event.data["error"] not in ("", UNEXPECTED)


# --- credentials never shown ---------------------------------------------------------------------

def _every_page(client, tw) -> dict[str, str]:
    """Every console page of tenant A that GET opens, and its HTML."""
    pages = {}
    for name, params in console_routes():
        url = console_url(name, params, tw)
        response = client.get(url)
        if response.status_code == 200:
            pages[url] = page_text(response)
    return pages


@override_settings(TOOLKEEPER_MCP_STDIO_SERVERS=STDIO)
def test_no_page_shows_a_stored_credential(world):
    a = world.a
    client = a.console("admin")
    created = client.post(reverse("console:mcp_server_create", kwargs={"tenant": a.tenant.slug}), {
        "name": "github", "transport": "streamable_http", "url": PUBLIC_URL, "timeout_s": "30", "enabled": "on",
        "headers": f'{{"Authorization": "Bearer {SECRET}", "X-Team": "core"}}'})
    assert created.status_code == 302, created.content.decode()[:2000]
    files = client.post(reverse("console:mcp_server_create", kwargs={"tenant": a.tenant.slug}), {
        "name": "files", "transport": "stdio", "command": "files", "timeout_s": "30",
        "env": f"API_TOKEN={ENV_SECRET}"})
    assert files.status_code == 302, files.content.decode()[:2000]
    github = McpServer.objects.for_tenant(a.tenant).get(name="github")
    assert dict(github.headers) == {"Authorization": f"Bearer {SECRET}", "X-Team": "core"}
    assert dict(McpServer.objects.for_tenant(a.tenant).get(name="files").env) == {"API_TOKEN": ENV_SECRET}
    pages = _every_page(client, a)
    for server in McpServer.objects.for_tenant(a.tenant):
        for name in ("mcp_server_detail", "mcp_server_edit", "mcp_server_delete"):
            url = reverse(f"console:{name}", kwargs={"tenant": a.tenant.slug, "server_id": server.pk})
            pages[url] = client.get(url).content.decode()
    assert len(pages) > 15
    for url, html in pages.items():
        assert SECRET not in html and ENV_SECRET not in html, url
    detail = pages[reverse("console:mcp_server_detail", kwargs={"tenant": a.tenant.slug, "server_id": github.pk})]
    assert "2 set (Authorization, X-Team)" in detail
    edit = pages[reverse("console:mcp_server_edit", kwargs={"tenant": a.tenant.slug, "server_id": github.pk})]
    assert "2 headers set (Authorization, X-Team)" in edit and "Replace the headers" in edit


def test_a_refused_form_does_not_show_the_credentials_back(world):
    a = world.a
    response = a.console("admin").post(reverse("console:mcp_server_create", kwargs={"tenant": a.tenant.slug}), {
        "name": "github", "transport": "streamable_http", "url": "http://127.0.0.1/mcp", "timeout_s": "30",
        "headers": f"Authorization: Bearer {SECRET}"})
    assert response.status_code == 400
    html = response.content.decode()
    assert "is a loopback address" in html and SECRET not in html


def test_edit_keeps_replaces_and_removes_headers(world):
    a = world.a
    server = _server(a)
    client = a.console("operator")
    url = reverse("console:mcp_server_edit", kwargs={"tenant": a.tenant.slug, "server_id": server.pk})
    form = {"transport": "streamable_http", "url": PUBLIC_URL, "timeout_s": "30", "enabled": "on"}
    assert client.post(url, form).status_code == 302
    assert dict(McpServer.objects.for_tenant(a.tenant).get(pk=server.pk).headers) == {
        "Authorization": f"Bearer {SECRET}"}
    assert client.post(url, {**form, "headers": "X-Other: 1"}).status_code == 302
    assert dict(McpServer.objects.for_tenant(a.tenant).get(pk=server.pk).headers) == {"X-Other": "1"}
    assert client.post(url, {**form, "clear_headers": "on"}).status_code == 302
    assert McpServer.objects.for_tenant(a.tenant).get(pk=server.pk).headers is None


# --- the server's page -----------------------------------------------------------------------------

def test_the_detail_page_shows_status_errors_and_schemas_as_the_model_sees_them(world):
    a = world.a
    server = _server(a)
    schema = {"type": "object", "properties": {"query": {"type": "string"}, "repo": {"type": "string"}},
              "required": ["query", "repo"]}
    mcp_tools_reconcile(server=server, listed=[UpstreamTool("search", "Search code.", schema),
                                               UpstreamTool("repo.delete", "Delete a repo.", schema),
                                               UpstreamTool("old", "", schema)])
    mcp_tools_reconcile(server=server, listed=[UpstreamTool("search", "Search code.", schema),
                                               UpstreamTool("repo.delete", "Delete a repo.", schema)])
    search = Tool.objects.for_tenant(a.tenant).get(name="mcp__github__search")
    binding_set(tenant=a.tenant, tool=search, name="repo", value="acme/bound-repo-value")
    binding_set(tenant=a.tenant, tool=search, name="query", value="x", agent="narrow-bot")
    delete = Tool.objects.for_tenant(a.tenant).get(source_ref="repo.delete")
    tool_update(tool=delete, enabled=False)
    McpServer.objects.for_tenant(a.tenant).filter(pk=server.pk).update(
        status="error", last_error="the server answered 401 Unauthorized: check its credentials")

    page = a.console("viewer").get(
        reverse("console:mcp_server_detail", kwargs={"tenant": a.tenant.slug, "server_id": server.pk}))
    assert page.status_code == 200
    html = page.content.decode()
    assert "the server answered 401 Unauthorized: check its credentials" in html and 'data-status="error"' in html
    search_block = html.split('data-tool="mcp__github__search"')[1].split('class="card"')[0]
    assert '&quot;repo&quot;' not in search_block and "acme/bound-repo-value" not in html  # bound: hidden
    assert "&quot;query&quot;" in search_block and "narrow-bot" in search_block
    assert 'data-state="enabled"' in search_block
    assert 'data-state="disabled"' in html.split(f'data-tool="{delete.name}"')[1].split('class="card"')[0]
    assert 'data-state="gone"' in html.split('data-tool="mcp__github__old"')[1]
    assert "Sync now" not in html  # a viewer has no buttons
    assert "Sync now" in a.console("operator").get(
        reverse("console:mcp_server_detail", kwargs={"tenant": a.tenant.slug, "server_id": server.pk})
    ).content.decode()


def test_the_list_shows_each_servers_status_and_tools(world):
    a = world.a
    server = _server(a)
    mcp_tools_reconcile(server=server, listed=[UpstreamTool("search", "", {"type": "object"})])
    _server(a, name="down")
    McpServer.objects.for_tenant(a.tenant).filter(name="down").update(status="error", last_error="refused: no route")
    _server(world.b, name="globex-only")
    url = reverse("console:mcp_server_list", kwargs={"tenant": a.tenant.slug})
    html = a.console("viewer").get(url).content.decode()
    assert "github" in html and "1 enabled" in html and "refused: no route" in html
    assert "globex-only" not in html
    assert 'href="/t/acme/mcp-servers/"' in html  # the navigation entry


def test_another_tenants_server_is_404_on_every_page(world):
    theirs = _server(world.b)
    client = world.a.console("admin")
    for name in ("mcp_server_detail", "mcp_server_edit", "mcp_server_delete", "mcp_server_sync", "mcp_server_test"):
        url = reverse(f"console:{name}", kwargs={"tenant": world.a.tenant.slug, "server_id": theirs.pk})
        assert client.get(url).status_code == 404, name
        assert client.post(url, {"transport": "sse", "url": PUBLIC_URL, "timeout_s": "1"}).status_code == 404, name
    same = McpServer.objects.for_tenant(world.b.tenant).get(pk=theirs.pk)
    assert (same.transport, same.timeout_s, same.status) == ("streamable_http", 30, "new")


def test_a_disabled_server_is_neither_synced_nor_tested(world):
    a = world.a
    server = _server(a, enabled=False)
    client = a.console("operator")
    for name in ("mcp_server_sync", "mcp_server_test"):
        url = reverse(f"console:{name}", kwargs={"tenant": a.tenant.slug, "server_id": server.pk})
        page = client.post(url, follow=True).content.decode()
        assert "the server is disabled" in page, name
    assert not Event.objects.for_tenant(a.tenant).filter(verb__in=["mcp_server.synced", "mcp_server.tested"]).exists()


def test_new_tools_join_no_group(world):
    server = _server(world.a)
    mcp_tools_reconcile(server=server, listed=[UpstreamTool("search", "", {"type": "object"})])
    tool = Tool.objects.for_tenant(world.a.tenant).get(name="mcp__github__search")
    assert not ToolGroup.objects.for_tenant(world.a.tenant).filter(tools=tool).exists()
