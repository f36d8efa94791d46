"""The Django admin works across tenants for superusers (the default managers fail closed)."""
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tools.models import AgentSession, BoundArgument, McpServer, Tool, ToolCall, ToolGroup
from tools.upstream.client import UpstreamTool
from tools.upstream.servers import mcp_server_create, mcp_tools_reconcile

pytestmark = pytest.mark.django_db

MODELS = [Tool, ToolGroup, BoundArgument, AgentSession, ToolCall]


@pytest.fixture
def superuser_client():
    user = get_user_model().objects.create_superuser(username="root", password="x", email="")
    client = Client()
    client.force_login(user)
    return client


def _objects(world):
    return {
        Tool: world.a.tools["current_time"],
        ToolGroup: world.a.groups["math"],
        BoundArgument: world.a.binding,
        AgentSession: world.a.session,
        ToolCall: world.a.calls[1],
    }


def test_superuser_sees_every_tenants_rows(world, superuser_client):
    for model in MODELS:
        url = f"/admin/tools/{model._meta.model_name}/"
        response = superuser_client.get(url)
        assert response.status_code == 200, url
        body = response.content.decode()
        assert ">acme<" in body and ">globex<" in body, url  # rows of both tenants
    for model, obj in _objects(world).items():
        url = f"/admin/tools/{model._meta.model_name}/{obj.pk}/change/"
        response = superuser_client.get(url)
        assert response.status_code == 200, url
    call_page = superuser_client.get(f"/admin/tools/toolcall/{world.a.calls[1].pk}/change/").content.decode()
    assert "ToolNotAvailable" in call_page  # the CallEvent inline


def test_admin_refuses_linking_rows_of_two_tenants(world, superuser_client):
    group = world.a.groups["math"]
    foreign = world.b.tools["calculate"]
    response = superuser_client.post(f"/admin/tools/toolgroup/{group.pk}/change/", {
        "tenant": world.a.tenant.pk, "name": "math", "description": "", "notes": "", "switchable": "on",
        "tools": [foreign.pk], "skill_ref": "",
    })
    assert response.status_code == 200
    assert "belongs to another tenant" in response.content.decode()
    assert not group.tools.filter(pk=foreign.pk).exists()


def test_staff_without_superuser_cannot_use_it(world):
    user = get_user_model().objects.create_user(username="staff", password="x", is_staff=True)
    client = Client()
    client.force_login(user)
    for model in MODELS:
        assert client.get(f"/admin/tools/{model._meta.model_name}/").status_code == 403


def test_admin_adds_a_binding_and_refuses_a_duplicate(world, superuser_client):
    """Uniqueness checks of tenant-owned rows (tool, agent, name) run in the admin without a 500."""
    tool = world.a.tools["current_time"]
    form = {"tenant": world.a.tenant.pk, "tool": tool.pk, "agent": "", "name": "timezone", "value": '"UTC"'}
    response = superuser_client.post("/admin/tools/boundargument/add/", form)
    assert response.status_code == 302
    assert BoundArgument.objects.for_tenant(world.a.tenant).get(tool=tool, agent="", name="timezone").value == "UTC"
    again = superuser_client.post("/admin/tools/boundargument/add/", {**form, "value": '"Europe/Berlin"'})
    assert again.status_code == 200
    assert "already exists" in again.content.decode()
    assert BoundArgument.objects.for_tenant(world.a.tenant).filter(tool=tool, agent="", name="timezone").count() == 1


MCP_TOKEN = "Bearer admin-page-5ecret-31c"  # noqa: S105


def _mcp_server(tenant, **fields):
    return mcp_server_create(tenant=tenant, name="github", transport="streamable_http",
                             url="https://93.184.215.14/mcp", headers={"Authorization": MCP_TOKEN}, **fields)


def _admin_form(server, **changes) -> dict:
    form = {"tenant": server.tenant_id, "name": server.name, "transport": server.transport, "url": server.url,
            "command": "", "timeout_s": server.timeout_s, "include": "[]", "exclude": "[]",
            "accounts": server.accounts, "oauth_scopes": server.oauth_scopes}
    form.update({"enabled": "on"} if server.enabled else {})
    return {**form, **changes}


def test_admin_shows_mcp_servers_with_header_names_only(world, superuser_client):
    server = _mcp_server(world.a.tenant)
    for url in ("/admin/tools/mcpserver/", f"/admin/tools/mcpserver/{server.pk}/change/"):
        response = superuser_client.get(url)
        assert response.status_code == 200, url
        assert "admin-page-5ecret" not in response.content.decode()
    assert "Authorization" in superuser_client.get(f"/admin/tools/mcpserver/{server.pk}/change/").content.decode()


def test_admin_checks_an_mcp_server_as_tenants_forms_do_and_keeps_its_headers(world, superuser_client):
    server = _mcp_server(world.a.tenant)
    url = f"/admin/tools/mcpserver/{server.pk}/change/"
    refused = superuser_client.post(url, _admin_form(server, url="http://169.254.169.254/latest/"))
    assert refused.status_code == 200 and "a cloud metadata address" in refused.content.decode()
    moved = superuser_client.post(url, _admin_form(server, url="https://93.184.215.15/mcp"))
    assert moved.status_code == 200 and "send the headers again" in moved.content.decode()
    saved = superuser_client.post(url, _admin_form(server, timeout_s=9))
    assert saved.status_code == 302, saved.content.decode()[:3000]
    server = McpServer.objects.for_tenant(world.a.tenant).get(pk=server.pk)
    assert server.timeout_s == 9 and dict(server.headers) == {"Authorization": MCP_TOKEN}


def test_admin_deleting_an_mcp_server_disables_its_tools(world, superuser_client):
    server = _mcp_server(world.a.tenant)
    mcp_tools_reconcile(server=server, listed=[UpstreamTool("search", "", {"type": "object"})])
    response = superuser_client.post(f"/admin/tools/mcpserver/{server.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    tool = Tool.objects.for_tenant(world.a.tenant).get(name="mcp__github__search")
    assert tool.enabled is False and tool.mcp_server_id is None
